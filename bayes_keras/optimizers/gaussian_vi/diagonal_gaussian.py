"""DiagonalGaussian: q = N(mu, diag(p)^-1), MGVBP's step elementwise."""

import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.optimizers.gaussian_vi import natural_gradients as ng
from bayes_keras.optimizers.gaussian_vi.gaussian_family import GaussianFamily, current

tfd = tfp.distributions


class DiagonalGaussian(GaussianFamily):
    """A diagonal precision p (D,): every operation is elementwise, O(D).

    The retraction p + xi + xi^2 / (2p) = ((p + xi)^2 + p^2) / (2p) is positive for any finite xi, so
    no step halving is needed (Magris et al., the diagonal case of the PD retraction).

    Further arguments:

    - dim, dtype: see GaussianFamily.

    Args:
        initial_precision: p at the start, for every weight.
        control_variates: also keep the score estimators' control variates ("c_mean", "c_precision").

    Example:
        >>> family = DiagonalGaussian(dim=10, dtype="float32", initial_precision=1e3)
        >>> state = family.variables(add_variable, "block0")
    """

    def __init__(self, dim, dtype, initial_precision, control_variates=False):
        super().__init__(dim, dtype)
        self.initial_precision = float(initial_precision)
        self.control_variates = bool(control_variates)

    def variables(self, add_variable, prefix):
        names = ["mean", "precision", "m_mean", "m_precision"] + (
            ["c_mean", "c_precision"] if self.control_variates else []
        )
        return {name: add_variable((self.dim,), f"{prefix}_{name}", self.dtype) for name in names}

    def initialize(self, state, mean):
        state["mean"].assign(mean)
        state["precision"].assign(self.initial_precision * tf.ones(self.dim, self.dtype))

    def moments(self, state, read=current):
        """(mean, standard deviation) as (D,) tensors."""
        return read(state["mean"]), tf.math.rsqrt(read(state["precision"]))

    def sample(self, state, eps, read=current):
        return ng.sample_diag(read(state["mean"]), read(state["precision"]), eps)

    def entropy(self, state):
        return ng.entropy_diag(state["precision"].value)

    def distribution(self, state):
        return tfd.Independent(
            tfd.Normal(state["mean"].value, tf.math.rsqrt(state["precision"].value)), 1
        )

    def marginal(self, state, offset, size):
        p = state["precision"].value[offset : offset + size]
        return tfd.Independent(
            tfd.Normal(state["mean"].value[offset : offset + size], tf.math.rsqrt(p)), 1
        )

    def step(self, state, nat_mu, nat_p, learning_rate, mean_learning_rate, omega, writes):
        """Momentum, the mean step and the retraction of p for natural gradients (nat_mu, nat_p)."""
        m_mu = self.momentum(state, "m_mean", nat_mu, omega)
        m_p = self.momentum(state, "m_precision", nat_p, omega)
        old_p = state["precision"].value
        new_p = ng.retract_diag(old_p, learning_rate * m_p)
        writes.require(tf.reduce_all(new_p > 0))  # an underflow to 0 is as fatal as an overflow
        for name, value in (
            ("mean", state["mean"].value + mean_learning_rate * m_mu),
            ("precision", new_p),
            ("m_mean", m_mu),
            ("m_precision", ng.transport_diag(m_p, old_p, new_p)),
        ):
            writes.assign(state[name], value)
