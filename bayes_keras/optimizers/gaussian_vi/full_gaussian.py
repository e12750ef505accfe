"""FullGaussian: q = N(mu, P^-1) with a dense D x D precision."""

import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.core.step_rules import signal_fraction
from bayes_keras.optimizers.gaussian_vi import natural_gradients as ng
from bayes_keras.optimizers.gaussian_vi.gaussian_family import GaussianFamily, current

tfd = tfp.distributions


class FullGaussian(GaussianFamily):
    """A dense precision P (D, D), in float64 (Cholesky factors, inverses, log-determinants): O(D^3).

    MGVBP's step retracts P <- P + xi + 1/2 xi P^-1 xi; if round-off breaks positive definiteness, xi is
    halved up to `max_halvings` times, then the precision step is dropped. The momentum of P lives in
    the tangent space at P and is carried to the new point by vector transport.

    Further arguments:

    - dim, dtype: see GaussianFamily.

    Args:
        initial_precision: P at the start, times the identity.
        control_variates: also keep the score estimators' control variates ("c_mean", "c_precision").
        max_halvings: halvings of xi tried before a precision step is dropped.
        signal_share: scale the mean and precision steps by their signal shares (default True, an
            extension: `bayes_keras.step_rules.signal_fraction`); False steps by the step sizes alone, the
            paper's iteration (the "v_mean" / "v_precision" averages are then kept but not updated).

    Example:
        >>> family = FullGaussian(dim=31, dtype="float64", initial_precision=10.0)
    """

    def __init__(
        self,
        dim,
        dtype,
        initial_precision,
        control_variates=False,
        max_halvings=5,
        signal_share=True,
    ):
        super().__init__(dim, dtype)
        self.initial_precision = float(initial_precision)
        self.control_variates = bool(control_variates)
        self.max_halvings = int(max_halvings)
        self.signal_share = bool(signal_share)

    def variables(self, add_variable, prefix):
        vector, matrix = (self.dim,), (self.dim, self.dim)
        shapes = {
            "mean": vector,
            "precision": matrix,
            "m_mean": vector,
            "m_precision": matrix,
            "v_mean": (),
            "v_precision": (),
        }
        if self.control_variates:
            shapes.update({"c_mean": vector, "c_precision": matrix})
        return {
            name: add_variable(shape, f"{prefix}_{name}", self.dtype)
            for name, shape in shapes.items()
        }

    def initialize(self, state, mean):
        state["mean"].assign(mean)
        state["precision"].assign(self.initial_precision * tf.eye(self.dim, dtype=self.dtype))

    def sample(self, state, eps, read=current):
        return ng.sample_full(read(state["mean"]), read(state["precision"]), eps)

    def entropy(self, state):
        return ng.entropy_full(state["precision"].value)

    def distribution(self, state):
        # Sigma = L^-T L^-1 with P = L L^T; its Cholesky factor is chol(inv(P)).
        return tfd.MultivariateNormalTriL(
            state["mean"].value, tf.linalg.cholesky(tf.linalg.inv(state["precision"].value))
        )

    def marginal(self, state, offset, size):
        cov = tf.linalg.inv(state["precision"].value)[
            offset : offset + size, offset : offset + size
        ]
        return tfd.MultivariateNormalTriL(
            state["mean"].value[offset : offset + size], tf.linalg.cholesky(cov)
        )

    def step(self, state, nat_mu, nat_p, learning_rate, mean_learning_rate, omega, writes):
        """Momentum, the mean step and the retraction of P (with halving) for natural gradients."""
        m_mu = self.momentum(state, "m_mean", nat_mu, omega)
        m_p = self.momentum(state, "m_precision", nat_p, omega)

        # With signal_share, both steps are scaled by their signal shares: the Monte Carlo noise of the gradients
        # and of the Stein / score curvature is averaged once q is near its optimum (an extension; see
        # step_rules.signal_fraction): v <- omega v + (1 - omega) |natgrad|^2 beside the momentum m, the share
        # from |m|^2 / v.
        def share(name, m, natgrad):
            v = omega * state[name].value + (1.0 - omega) * tf.reduce_sum(tf.square(natgrad))
            writes.assign(state[name], v)
            return signal_fraction(tf.reduce_sum(tf.square(m)), v, omega)

        if self.signal_share:
            mean_learning_rate *= share("v_mean", m_mu, nat_mu)
            learning_rate *= share("v_precision", m_p, nat_p)
        old_p = state["precision"].value
        chol = tf.linalg.cholesky(old_p)  # every halving retracts from the same P: factor it once
        retract = lambda p, xi: ng.retract_full(p, xi, chol)  # noqa: E731
        xi = learning_rate * m_p
        # Halving answers round-off, not a NaN step (e.g. a NaN learning rate): that refuses the update.
        writes.require(tf.reduce_all(tf.math.is_finite(xi)))
        new_p, _ = ng.retract_with_halving(
            old_p, xi, retract, ng.is_positive_definite_full, self.max_halvings
        )
        for name, value in (
            ("mean", state["mean"].value + mean_learning_rate * m_mu),
            ("precision", new_p),
            ("m_mean", m_mu),
            ("m_precision", ng.transport_full(m_p, old_p, new_p)),
        ):
            writes.assign(state[name], value)
