"""SoftplusGaussian: q = prod_i N(mu_i, softplus(rho_i)^2), Bayes by Backprop's family, stepped by Adam."""

import math

import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.optimizers.gaussian_vi.gaussian_family import GaussianFamily, current

tfd = tfp.distributions
_LOG_2PI_E = math.log(2.0 * math.pi) + 1.0


class SoftplusGaussian(GaussianFamily):
    """A diagonal Gaussian parametrised by its mean and rho, sigma = softplus(rho) (unconstrained, so that a
    plain gradient step keeps sigma positive), with Adam's moments of both beside them.

    Its step takes the reparameterised gradients of the negative ELBO with respect to mu and sigma and applies
    the Adam rule to (mu, rho) (d/d rho = d/d sigma * sigmoid(rho)). The same weights as DiagonalGaussian's,
    another coordinate system: that family steps the precision by natural gradients (MGVBP); this one is
    the Euclidean baseline (MeanFieldVI).

    Further arguments:

    - dim, dtype: see GaussianFamily.

    Args:
        initial_std: sigma at the start.
        adam: the `bayes_keras.step_rules.ElementwiseAdam` applied to (mu, rho).

    Example:
        >>> family = SoftplusGaussian(dim=10, dtype="float32", initial_std=0.01, adam=step_rules.ElementwiseAdam())
    """

    def __init__(self, dim, dtype, initial_std, adam):
        super().__init__(dim, dtype)
        self.initial_std = float(initial_std)
        self.adam = adam

    def variables(self, add_variable, prefix):
        names = ["mean", "rho", "mean_m", "mean_v", "rho_m", "rho_v"]
        return {name: add_variable((self.dim,), f"{prefix}_{name}", self.dtype) for name in names}

    def initialize(self, state, mean):
        state["mean"].assign(mean)
        rho = float(tfp.math.softplus_inverse(tf.constant(self.initial_std, tf.float64)))
        state["rho"].assign(tf.fill(mean.shape, tf.constant(rho, self.dtype)))

    def moments(self, state, read=current):
        """(mean, standard deviation) as (D,) tensors."""
        return read(state["mean"]), tf.nn.softplus(read(state["rho"]))

    def sample(self, state, eps, read=current):
        mean, std = self.moments(state, read)
        return mean + tf.cast(eps, mean.dtype) * std

    def entropy(self, state):
        sigma = self.moments(state)[1]
        return (
            tf.reduce_sum(tf.math.log(sigma))
            + 0.5 * tf.cast(tf.size(sigma), sigma.dtype) * _LOG_2PI_E
        )

    def distribution(self, state):
        return tfd.Independent(tfd.Normal(*self.moments(state)), 1)

    def marginal(self, state, offset, size):
        mean, std = self.moments(state)
        return tfd.Independent(
            tfd.Normal(mean[offset : offset + size], std[offset : offset + size]), 1
        )

    def update(self, state, d_mean, d_sigma, learning_rate, iteration, writes):
        """Adam on (mu, rho) for the gradients of the negative ELBO with respect to mu and sigma."""
        d_rho = d_sigma * tf.sigmoid(state["rho"].value)
        for name, d in (("mean", d_mean), ("rho", d_rho)):
            moments = {"m": state[f"{name}_m"].value, "v": state[f"{name}_v"].value}
            update, new = self.adam.apply(d, moments, learning_rate, tf.cast(iteration, d.dtype))
            writes.assign(state[f"{name}_m"], new["m"])
            writes.assign(state[f"{name}_v"], new["v"])
            writes.assign(state[name], state[name].value - update)
