"""MeanFieldVI: the standard mean-field Gaussian VI baseline (reparameterisation gradient + Adam)."""

import math

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras._config import check_number
from bayes_keras.core import step_rules
from bayes_keras.optimizers.gaussian_vi.gaussian_variational_optimizer import GaussianVariationalOptimizer

tfd = tfp.distributions
_LOG_2PI_E = math.log(2.0 * math.pi) + 1.0


@keras.saving.register_keras_serializable(package="bayes_keras")
class MeanFieldVI(GaussianVariationalOptimizer):
    """q = prod_i N(mu_i, sigma_i^2), sigma = softplus(rho), fitted by Adam on the reparameterised
    negative ELBO ("Weight Uncertainty in Neural Networks", Blundell et al., ICML 2015,
    https://arxiv.org/abs/1505.05424: the Gaussian posterior of its Sec. 3.2) with the model's N particles as the
    N Monte Carlo samples of each step:

        d(-ELBO)/d mu    = mean_n g_n
        d(-ELBO)/d sigma = mean_n g_n eps_n - 1 / sigma        (g = grad of -log p(y, w) at w_n)

    The baseline that MGVBP's natural-gradient updates are compared with, on the same machinery:
    the same samples, the same posterior() / sample() / "elbo" metric.

    Args:
        learning_rate: Adam step size on (mu, rho).
        initial_std: sigma at the start (mu starts at the first particle's initial weights).
        beta_1, beta_2, epsilon: Adam's constants.
        antithetic: draw the samples of q in mirrored pairs mu +- a (None / True, the default, with
            an even number of samples; odd counts draw independently): half the random numbers,
            which dominated the cost of a step on CPU, and exact cancellation of the gradient's odd
            part in the draw.
        seed: seed of the sample stream.

    Example:
        >>> model.compile(optimizer=bayes_keras.optimizers.MeanFieldVI(1e-3))
    """

    def __init__(self, learning_rate=1e-3, initial_std=1e-2, beta_1=0.9, beta_2=0.999, epsilon=1e-8, seed=None,
                 **kwargs):
        initial_std = check_number(initial_std, "MeanFieldVI initial_std")
        epsilon = check_number(epsilon, "MeanFieldVI epsilon")
        beta_1 = check_number(beta_1, "MeanFieldVI beta_1", positive=False)
        beta_2 = check_number(beta_2, "MeanFieldVI beta_2", positive=False)
        if not initial_std > 0:
            raise ValueError(f"MeanFieldVI initial_std must be positive; got {initial_std!r}.")
        super().__init__(learning_rate=learning_rate, seed=seed, **kwargs)
        self.initial_std = float(initial_std)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self._adam = step_rules.Adam(self.beta_1, self.beta_2, self.epsilon)

    _diagonal_posterior = True

    def _default_shared_learning_rate(self, learning_rate):
        return learning_rate  # an Adam learning rate already

    def _block_groups(self, view):
        return view.partition("joint")  # diagonal: one flat block over all weights

    def _build_block(self, j, dim):
        state = {"mean": self._var((dim,), f"block{j}_mean"), "rho": self._var((dim,), f"block{j}_rho")}
        for name in ("mean", "rho"):
            for slot in ("m", "v"):
                state[f"{name}_{slot}"] = self._var((dim,), f"block{j}_{name}_{slot}")
        return state

    def _initialize_block(self, j, mean):
        self._state[j]["mean"].assign(mean)
        rho = float(tfp.math.softplus_inverse(tf.constant(self.initial_std, tf.float64)))
        self._state[j]["rho"].assign(tf.fill(mean.shape, tf.constant(rho, self.posterior_dtype)))

    def _std(self, j, read=None):
        rho = self._state[j]["rho"]
        return tf.nn.softplus(rho.value if read is None else read(rho))

    def _block_entropy(self, j):
        sigma = self._std(j)
        return tf.reduce_sum(tf.math.log(sigma)) + 0.5 * tf.cast(tf.size(sigma), sigma.dtype) * _LOG_2PI_E

    def _block_distribution(self, j):
        return tfd.Independent(tfd.Normal(self._state[j]["mean"].value, self._std(j)), 1)

    def _marginal(self, j, offset, size):
        return tfd.Independent(tfd.Normal(self._state[j]["mean"].value[offset:offset + size],
                                          self._std(j)[offset:offset + size]), 1)

    _elementwise = True

    def _elementwise_moments(self, read):
        return read(self._state[0]["mean"]), self._std(0, read)

    def _update_elementwise(self, thetas, loss_grads, learning_rate, iteration, step, writes):
        # loss_grads g are gradients of -log p(y, w) at w = mu + sigma eps: d(-ELBO)/d mu = E[g],
        # d(-ELBO)/d sigma = E[g eps] - 1 / sigma, with g eps = g (w - mu) / sigma (divided on (D,)).
        s = self._state[0]
        mean, sigma = s["mean"].value, self._std(0)
        sum_g, sum_ga = [], []
        for m, theta, g in zip(tf.split(mean, self.view.sizes), thetas, loss_grads):
            sum_g.append(tf.reduce_sum(g, axis=0))
            sum_ga.append(tf.reduce_sum(g * (theta - m), axis=0))
        n = float(self.view.num_particles)
        d_mean = tf.concat(sum_g, 0) / n
        d_sigma = (tf.concat(sum_ga, 0) / n - 1.0) / sigma
        d_rho = d_sigma * tf.sigmoid(s["rho"].value)
        for name, d in (("mean", d_mean), ("rho", d_rho)):
            state = {"m": s[f"{name}_m"].value, "v": s[f"{name}_v"].value}
            update, new = self._adam.apply(d, state, learning_rate, tf.cast(iteration, d.dtype))
            writes.assign(s[f"{name}_m"], new["m"])
            writes.assign(s[f"{name}_v"], new["v"])
            writes.assign(s[name], s[name].value - update)

    def get_config(self):
        config = super().get_config()
        config.update({"initial_std": self.initial_std, "beta_1": self.beta_1, "beta_2": self.beta_2,
                       "epsilon": self.epsilon})
        return config
