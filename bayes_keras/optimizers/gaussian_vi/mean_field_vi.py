"""MeanFieldVI: the standard mean-field Gaussian VI baseline (reparameterisation gradient + Adam)."""

import keras
import tensorflow as tf

from bayes_keras._config import check_number
from bayes_keras.core import step_rules
from bayes_keras.optimizers.gaussian_vi.gaussian_variational_optimizer import (
    GaussianVariationalOptimizer,
)
from bayes_keras.optimizers.gaussian_vi.softplus_gaussian import SoftplusGaussian


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

    Further arguments:

    - beta_1, beta_2, epsilon: Adam's constants.

    Args:
        learning_rate: Adam step size on (mu, rho).
        initial_std: sigma at the start (mu starts at the first particle's initial weights).
        seed: seed of the sample stream.

    Other Parameters:
        antithetic: draw the samples of q in mirrored pairs mu +- a (None / True, the default, with
            an even number of samples; odd counts draw independently): half the random numbers,
            which dominated the cost of a step on CPU, and exact cancellation of the gradient's odd
            part in the draw.

    Example:
        >>> model.compile(optimizer=bayes_keras.optimizers.MeanFieldVI(1e-3))
    """

    def __init__(
        self,
        learning_rate=1e-3,
        initial_std=1e-2,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        seed=None,
        **kwargs,
    ):
        initial_std = check_number(initial_std, "MeanFieldVI initial_std")
        epsilon = check_number(epsilon, "MeanFieldVI epsilon")
        beta_1 = check_number(beta_1, "MeanFieldVI beta_1", positive=False)
        beta_2 = check_number(beta_2, "MeanFieldVI beta_2", positive=False)
        if not initial_std > 0:
            raise ValueError(f"MeanFieldVI initial_std must be positive; got {initial_std!r}.")
        super().__init__(learning_rate=learning_rate, seed=seed, **kwargs)
        self.initial_std = float(initial_std)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self._adam = step_rules.ElementwiseAdam(self.beta_1, self.beta_2, self.epsilon)

    _elementwise = True

    def default_shared_learning_rate(self, learning_rate):
        return learning_rate  # an Adam learning rate already

    def _partition(self, view):
        return view.partition("joint")  # diagonal: one flat block over all weights

    def _family(self, j, dim):
        return SoftplusGaussian(dim, self.posterior_dtype, self.initial_std, self._adam)

    def _update_elementwise(self, thetas, loss_grads, learning_rate, iteration, step, writes):
        # loss_grads g are gradients of -log p(y, w) at w = mu + sigma eps: d(-ELBO)/d mu = E[g],
        # d(-ELBO)/d sigma = E[g eps] - 1 / sigma, with g eps = g (w - mu) / sigma (divided on (D,)).
        family, state = self._families[0], self._state[0]
        mean, sigma = family.moments(state)
        sum_g, sum_ga = [], []
        for m, theta, g in zip(tf.split(mean, self.view.sizes), thetas, loss_grads):
            sum_g.append(tf.reduce_sum(g, axis=0))
            sum_ga.append(tf.reduce_sum(g * (theta - m), axis=0))
        n = float(self.view.num_particles)
        d_mean = tf.concat(sum_g, 0) / n
        d_sigma = (tf.concat(sum_ga, 0) / n - 1.0) / sigma
        family.update(state, d_mean, d_sigma, learning_rate, iteration, writes)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "initial_std": self.initial_std,
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
            }
        )
        return config
