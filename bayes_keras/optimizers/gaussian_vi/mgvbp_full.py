"""MGVBP with dense precisions: q = N(mu, P^-1) with one D x D precision (structure="full", the paper's main
case) or one per layer (structure="layer"), for small models: O(D^3) per step, in float64.

Magris, Shabani & Iosifidis, "Manifold Gaussian Variational Bayes on the Precision Matrix",
https://arxiv.org/abs/2210.14598. Read with `MGVBP` (mgvbp.py: arguments, step sizes, clipping), the
sampling base (gaussian_variational_optimizer.py) and the manifold (precision_manifold.py). With samples
theta_s = mu + L^-T eps_s (P = L L^T), a_s = theta_s - mu, g_s the gradient at theta_s of the tempered log
joint (log p(y | theta) + log p(theta)) / temperature (S = N, the model's particles), sym(X) = (X + X^T) / 2 and
Cov(a, g) = sum_s (a_s - a_bar)(g_s - g_bar)^T / (S - 1) (D x D, rows indexed by a), per block:

    natural gradient, estimator="gradient" (Price / Stein; an extension for networks)
        nat_mu = P^-1 E[g] ;  nat_P = -sym(P Cov(a, g)) - P                `reparam_natural_gradient_full`
    estimator="score" (the paper's estimator B) / "score_h" (its black-box form A)
        nat_mu = mean_s a_s (f_s - c) [- Sigma Lambda_0 (mu - mu_0)]
        nat_P = mean_s (P - P a_s a_s^T P)(f_s - c) [+ Lambda_0 - P]       `score_natural_gradient_full`
    momentum, mean step, retraction with halving, transport                `FullGaussian.update`
    signal shares of the two steps (signal_share=True, an extension)      `FullGaussian.update`
"""

import math

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.core.step_rules import signal_fraction
from bayes_keras.saving.loaded_state import check_positive_definite_entry
from bayes_keras.optimizers.gaussian_vi import precision_manifold as manifold
from bayes_keras.optimizers.gaussian_vi.gaussian_family import GaussianFamily, current
from bayes_keras.optimizers.gaussian_vi import mgvbp_update
from bayes_keras.optimizers.gaussian_vi.mgvbp import MGVBP
from bayes_keras.optimizers.gaussian_vi.mgvbp_update import control_variate

tfd = tfp.distributions
_LOG_2PI_E = math.log(2.0 * math.pi) + 1.0


# -- the natural gradient ------------------------------------------------------------------------
def reparam_natural_gradient_full(theta, mean, precision, grad_log_joint, antithetic=False):
    """nat_mu = Sigma mean_s g_s ;  nat_P = -sym(P Cov_s(a, g)) - P, from E[hess log p] = P E[a g^T] (Stein).

    g = grad log p(y, theta) (the log JOINT, prior included). Fixed point: mu where E[g] = 0, P = -E[hess].
    Cov is centred by both sample means over S - 1 (subtracting g's mean is a free control variate); with
    `antithetic` (mirrored pairs, sum_s a_s = 0) it is a^T g / S."""
    chol = tf.linalg.cholesky(precision)
    nat_mu = tf.linalg.cholesky_solve(chol, tf.reduce_mean(grad_log_joint, axis=0)[:, None])[:, 0]
    a = theta - mean[None, :]
    s = tf.cast(tf.shape(a)[0], a.dtype)
    if antithetic:
        cross = tf.matmul(a, grad_log_joint, transpose_a=True) / s
    else:
        a = a - tf.reduce_mean(a, axis=0, keepdims=True)
        g = grad_log_joint - tf.reduce_mean(grad_log_joint, axis=0, keepdims=True)
        cross = tf.matmul(a, g, transpose_a=True) / (s - 1.0)
    return nat_mu, -manifold.symmetrize(tf.matmul(precision, cross)) - precision


def score_natural_gradient_full(
    theta, mean, precision, f, c_mu, c_p, prior_mean=None, prior_precision=None
):
    """The paper's score-function (black-box) estimators, full precision.

    With prior_precision None (estimator "score_h"): f_s = h(theta_s) = log p(y, theta_s) - log q(theta_s),
        nat_mu = mean_s a_s (f_s - c) ;  nat_P = mean_s (P - P a_s a_s^T P)(f_s - c).
    With a Gaussian prior N(mu0, diag(1 / prior_precision)) (estimator "score", the paper's default),
    f_s = log p(y | theta_s) and prior + entropy enter in closed form:
        nat_mu += -Sigma Lambda0 (mu - mu0) ;  nat_P += Lambda0 - P.

    c_mu (D,), c_p (D, D): per-coordinate control variates (from the previous iteration).
    Returns nat_mu, nat_P and the control variates computed from these samples (for the next step).
    """
    a = theta - mean[None, :]
    pa = tf.matmul(a, precision)  # rows P a_s
    score_p = precision[None] - pa[:, :, None] * pa[:, None, :]  # (S, D, D)
    nat_mu = tf.reduce_mean(a * (f[:, None] - c_mu[None, :]), axis=0)
    nat_p = manifold.symmetrize(tf.reduce_mean(score_p * (f[:, None, None] - c_p[None]), axis=0))
    if prior_precision is not None:
        chol = tf.linalg.cholesky(precision)
        shift = tf.linalg.cholesky_solve(chol, (prior_precision * (mean - prior_mean))[:, None])
        nat_mu += -shift[:, 0]
        nat_p += tf.linalg.diag(prior_precision) - precision
    return nat_mu, nat_p, control_variate(a, f), control_variate(score_p, f)


# -- sampling and entropy ------------------------------------------------------------------------
def sample_full(mean, precision, eps):
    """theta = mu + L^-T eps for eps (S, D) standard normal: Cov(theta) = P^-1 without forming it."""
    chol = tf.linalg.cholesky(precision)
    z = tf.linalg.triangular_solve(tf.linalg.matrix_transpose(chol), tf.transpose(eps), lower=False)
    return mean[None, :] + tf.transpose(z)


def entropy_full(precision):
    d = tf.cast(tf.shape(precision)[0], precision.dtype)
    logdet = 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(tf.linalg.cholesky(precision))))
    return -0.5 * logdet + 0.5 * d * _LOG_2PI_E


def log_q_full(theta, mean, precision):
    """log N(theta_s; mu, P^-1) for theta (S, D)."""
    a = theta - mean[None, :]
    quad = tf.reduce_sum(tf.matmul(a, precision) * a, axis=1)
    half_logdet = tf.reduce_sum(tf.math.log(tf.linalg.diag_part(tf.linalg.cholesky(precision))))
    d = tf.cast(tf.shape(a)[1], a.dtype)
    return -0.5 * quad + half_logdet - 0.5 * d * math.log(2.0 * math.pi)


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
        return sample_full(read(state["mean"]), read(state["precision"]), eps)

    def entropy(self, state):
        return entropy_full(state["precision"].value)

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

    def update(self, state, nat_mu, nat_p, learning_rate, mean_learning_rate, omega, writes):
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
        retract = lambda p, xi: manifold.retract_full(p, xi, chol)  # noqa: E731
        xi = learning_rate * m_p
        # Halving answers round-off, not a NaN step (e.g. a NaN learning rate): that refuses the update.
        writes.require(tf.reduce_all(tf.math.is_finite(xi)))
        new_p, _ = manifold.retract_with_halving(
            old_p, xi, retract, manifold.is_positive_definite_full, self.max_halvings
        )
        for name, value in (
            ("mean", state["mean"].value + mean_learning_rate * m_mu),
            ("precision", new_p),
            ("m_mean", m_mu),
            ("m_precision", manifold.transport_full(m_p, old_p, new_p)),
        ):
            writes.assign(state[name], value)


@keras.saving.register_keras_serializable(package="bayes_keras")
class MGVBPFull(MGVBP):
    """`MGVBP(structure="full")` (one dense precision over all particle weights) and
    `MGVBP(structure="layer")` (one per layer). Construct it as MGVBP(structure=...); the arguments are
    MGVBP's."""

    structures = ("full", "layer")

    def _partition(self, view):
        return view.partition("joint" if self.structure == "full" else "layer")

    def check_structure(self, view):
        for g in self._partition(view):
            dim = sum(view.sizes[i] for i in g)
            if dim > self.max_block_size:
                names = ", ".join(view.variables[i].path for i in g)
                raise ValueError(
                    f"MGVBP structure='{self.structure}' needs a {dim} x {dim} precision block for [{names}], "
                    f"above max_block_size={self.max_block_size} (O(D^3) per step). Use "
                    + (
                        "structure='layer' (one block per layer), "
                        if self.structure == "full"
                        else ""
                    )
                    + "structure='kronecker' (Dense and Conv2D layers) or structure='diagonal' for a model "
                    "this large, or raise max_block_size."
                )

    def _family(self, j, dim):
        return FullGaussian(
            dim,
            self.posterior_dtype,
            self.initial_precision,
            self.estimator != "gradient",
            self.max_halvings,
            self.signal_share,
        )

    def check_loaded_state(self):
        super().check_loaded_state()
        for block in self._state:
            check_positive_definite_entry(self.name, block["precision"], "optimizer", "a precision")

    def _update_blocks(self, thetas, grads, learning_rate, iteration, step, writes):
        """Per block, the (N, D_b) samples and gradients of the log joint (ascent)."""
        sizes = mgvbp_update.step_sizes(self, learning_rate, iteration)
        for j, (theta, grad) in enumerate(zip(thetas, grads)):
            state = self._state[j]
            mean, precision = state["mean"].value, state["precision"].value
            if self.estimator == "gradient":
                antithetic = self._antithetic_for(self.view.num_particles)
                nat_mu, nat_p = reparam_natural_gradient_full(
                    theta, mean, precision, grad, antithetic
                )
            else:
                nat_mu, nat_p = mgvbp_update.score_natural_gradient(
                    self,
                    state,
                    self._blocks[j],
                    theta,
                    score_natural_gradient_full,
                    log_q_full,
                    step,
                    writes,
                )
            nat_mu, nat_p = mgvbp_update.clip(self, nat_mu, nat_p, iteration)
            self._families[j].update(state, nat_mu, nat_p, *sizes, writes)
