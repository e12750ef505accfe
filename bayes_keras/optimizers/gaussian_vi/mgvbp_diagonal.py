"""MGVBP with a diagonal precision, q = N(mu, diag(p)^-1): the structure for networks, read in this file with
`MGVBP` (mgvbp.py: arguments, step sizes, clipping) and the sampling base (gaussian_variational_optimizer.py).

Magris, Shabani & Iosifidis, "Manifold Gaussian Variational Bayes on the Precision Matrix",
https://arxiv.org/abs/2210.14598. Every operation is elementwise, O(S D) per step. With the step's samples
theta_s = mu + eps_s / sqrt(p), a_s = theta_s - mu and g_s the gradient at theta_s of the tempered log joint
(log p(y | theta) + log p(theta)) / temperature (S = N, the model's particles; lambda_0 and mu_0 the layers'
Normal priors' precision and mean; F the captured Fisher diagonal), the paper's equations map to:

    natural gradient, estimator="gradient" (Price / Stein; an extension for networks)
        nat_mu = E[g] / p ;  nat_p = -p Cov(a, g) - p               `reparam_natural_gradient_diag`
    ... curvature="empirical_fisher" / "fisher": nat_p = F + lambda_0 / temperature - p   `fisher_diagonal`
    estimator="score" (the paper's estimator B) / "score_h" (its black-box form A)
        nat_mu = mean_s a_s (f_s - c_mu) [- lambda_0 (mu - mu_0) / p]
        nat_p = mean_s (p - p^2 a_s^2)(f_s - c_p) [+ lambda_0 - p]   `score_natural_gradient_diag`
    momentum        m <- omega T(m) + (1 - omega) nat                 `DiagonalGaussian.update`
    mean            mu <- mu + beta_mu m_mu                           `DiagonalGaussian.update`
    retraction      p <- p + xi + xi^2 / (2 p),  xi = beta m_p        `retract_diag`
    transport       T(m_p) = m_p p_new / p_old                        `transport_diag`

The retraction ((p + xi)^2 + p^2) / (2 p) is positive for every finite xi: no step halving.
"""

import math

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.curvature.diagonal import per_example_squared_gradients
from bayes_keras.saving.loaded_state import check_bounded_entry
from bayes_keras.optimizers.gaussian_vi.gaussian_family import GaussianFamily, current
from bayes_keras.optimizers.gaussian_vi import mgvbp_update
from bayes_keras.optimizers.gaussian_vi.mgvbp import FISHERS, MGVBP
from bayes_keras.optimizers.gaussian_vi.mgvbp_update import control_variate, prior_vectors

tfd = tfp.distributions
_LOG_2PI_E = math.log(2.0 * math.pi) + 1.0


# -- the natural gradient ------------------------------------------------------------------------
def diagonal_moments_from_sums(sum_a, sum_g, sum_ag, num_samples, antithetic=False):
    """Per coordinate, the sample mean of g and the unbiased centred covariance Cov(a, g), from the sums over
    S samples: sum_s a_s g_s - S a_bar g_bar over S - 1 (a = theta - mu is centred at the known mean, so
    a_bar is O(sigma / sqrt(S)) and the subtraction cancels nothing). Subtracting g's mean is a free control
    variate: far from the optimum the mean gradient dominates g and would enter the curvature as noise.
    antithetic: the samples are mirrored pairs, sum_s a_s = 0 exactly and the normaliser is S."""
    s = float(num_samples)
    mean_g = sum_g / s
    if antithetic:
        return mean_g, sum_ag / s
    return mean_g, (sum_ag - sum_a * mean_g) / (s - 1.0)


def reparam_natural_gradient_diag(theta, mean, p, grads, antithetic=False, ascent=True):
    """nat_mu = E[g] / p, nat_p = -p Cov(a, g) - p (a = theta - mu; Stein's lemma: -E[hess] = -p Cov(a, g)).

    theta, grads: (S, D) tensors, or lists of (S, d_v) pieces whose columns make up D (the training step's
    per-variable tensors: the sums are taken per piece, nothing of size (S, D) is concatenated). grads are
    gradients of log p(y, theta) (ascent=True) or of -log p(y, theta) as the model hands them (ascent=False:
    negated on the (D,) sums)."""
    thetas = list(theta) if isinstance(theta, (list, tuple)) else [theta]
    grads = list(grads) if isinstance(grads, (list, tuple)) else [grads]
    means = tf.split(mean, [t.shape[1] for t in thetas]) if len(thetas) > 1 else [mean]
    sum_a, sum_g, sum_ag = [], [], []
    for m, t, g in zip(means, thetas, grads):
        a = t - m
        sum_a.append(tf.reduce_sum(a, axis=0))
        sum_g.append(tf.reduce_sum(g, axis=0))
        sum_ag.append(tf.reduce_sum(a * g, axis=0))
    sign = 1.0 if ascent else -1.0
    mean_g, cov = diagonal_moments_from_sums(
        tf.concat(sum_a, 0),
        sign * tf.concat(sum_g, 0),
        sign * tf.concat(sum_ag, 0),
        thetas[0].shape[0],
        antithetic,
    )
    return mean_g / p, -p * cov - p


def fisher_diagonal(view, records, curvature, dtype):
    """The tempered, data-set-scaled empirical (or sampled-label) Fisher diagonal over all particle weights,
    E_q by the mean over the N samples, from the layers' captured records."""
    labels = "sampled" if curvature == "fisher" else "observed"
    fisher = {}
    for r in records:
        # shared weights: a point estimate, no q to curve
        if getattr(r.layer, "deterministic", False):
            continue
        for variable, squares in per_example_squared_gradients(r, labels):
            flat = tf.reshape(tf.cast(squares, dtype), (view.num_particles, -1))
            fisher[view.index(variable)] = tf.cast(r.dataset_scale, dtype) * tf.reduce_mean(flat, 0)
    for i, variable in enumerate(view.variables):
        if i not in fisher:
            raise ValueError(
                f"MGVBP curvature={curvature!r}: no curvature was captured for {variable.path} "
                "(supported: Dense, Conv2D, Embedding and BatchNormalization particle layers)."
            )
    return tf.concat([fisher[i] for i in range(len(view))], 0)


def score_natural_gradient_diag(
    theta, mean, p, f, c_mu, c_p, prior_mean=None, prior_precision=None
):
    """The paper's score-function estimators, diagonal: the score of p_i is p_i - p_i^2 a_i^2.

    prior_precision None (estimator "score_h"): f_s = log p(y, theta_s) - log q(theta_s). With the Gaussian
    prior N(mu_0, diag(1 / prior_precision)) (estimator "score"): f_s = log p(y | theta_s), and the prior
    and the entropy enter in closed form. c_mu, c_p: the control variates of the previous step. Returns
    nat_mu, nat_p and the control variates of these samples."""
    a = theta - mean[None, :]
    score_p = p[None, :] - tf.square(p[None, :] * a)
    nat_mu = tf.reduce_mean(a * (f[:, None] - c_mu[None, :]), axis=0)
    nat_p = tf.reduce_mean(score_p * (f[:, None] - c_p[None, :]), axis=0)
    if prior_precision is not None:
        nat_mu += -prior_precision * (mean - prior_mean) / p
        nat_p += prior_precision - p
    return nat_mu, nat_p, control_variate(a, f), control_variate(score_p, f)


# -- the manifold --------------------------------------------------------------------------------
def retract_diag(p, xi):
    """Diagonal retraction p + xi + xi^2 / (2 p) = ((p + xi)^2 + p^2) / (2 p) > 0."""
    return p + xi + 0.5 * tf.square(xi) / p


def transport_diag(m, p_old, p_new):
    """The vector transport E m E^T with E = (P_new P_old^-1)^(1/2), diagonal."""
    return m * (p_new / p_old)


def entropy_diag(p):
    return tf.reduce_sum(-0.5 * tf.math.log(p) + 0.5 * _LOG_2PI_E)


def log_q_diag(theta, mean, p):
    a = theta - mean[None, :]
    return tf.reduce_sum(
        -0.5 * p * tf.square(a) + 0.5 * tf.math.log(p) - 0.5 * math.log(2.0 * math.pi), axis=1
    )


class DiagonalGaussian(GaussianFamily):
    """q = N(mu, diag(p)^-1) over `dim` weights, a diagonal precision p (D,), stepped by MGVBP.

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
        mean, sd = self.moments(state, read)
        return mean[None, :] + eps * sd[None, :]

    def entropy(self, state):
        return entropy_diag(state["precision"].value)

    def distribution(self, state):
        return tfd.Independent(tfd.Normal(*self.moments(state)), 1)

    def marginal(self, state, offset, size):
        mean, sd = self.moments(state)
        return tfd.Independent(
            tfd.Normal(mean[offset : offset + size], sd[offset : offset + size]), 1
        )

    def update(self, state, nat_mu, nat_p, learning_rate, mean_learning_rate, omega, writes):
        """Momentum, the mean step, the retraction of p and the transport of its momentum."""
        m_mu = self.momentum(state, "m_mean", nat_mu, omega)
        m_p = self.momentum(state, "m_precision", nat_p, omega)
        old_p = state["precision"].value
        new_p = retract_diag(old_p, learning_rate * m_p)
        writes.require(tf.reduce_all(new_p > 0))  # an underflow to 0 is as fatal as an overflow
        for name, value in (
            ("mean", state["mean"].value + mean_learning_rate * m_mu),
            ("precision", new_p),
            ("m_mean", m_mu),
            ("m_precision", transport_diag(m_p, old_p, new_p)),
        ):
            writes.assign(state[name], value)


@keras.saving.register_keras_serializable(package="bayes_keras")
class MGVBPDiagonal(MGVBP):
    """`MGVBP(structure="diagonal")`: one diagonal precision over all particle weights, in their dtype.

    Construct it as MGVBP(structure="diagonal") (the default); the arguments are MGVBP's.
    """

    structures = ("diagonal",)
    _elementwise = True

    def _partition(self, view):
        return view.partition("joint")

    def _family(self, j, dim):
        return DiagonalGaussian(
            dim, self.posterior_dtype, self.initial_precision, self.estimator != "gradient"
        )

    def check_loaded_state(self):
        super().check_loaded_state()
        check_bounded_entry(
            self.name,
            self._state[0]["precision"],
            "optimizer",
            "a diagonal precision",
            positive=True,
        )

    def _update_elementwise(self, thetas, loss_grads, learning_rate, iteration, step, writes):
        """thetas, loss_grads: per particle variable, the (N, d_v) samples and the gradients of -log p(y, w)."""
        state = self._state[0]
        mean, p = state["mean"].value, state["precision"].value
        n = self.view.num_particles
        if self.estimator != "gradient":
            nat_mu, nat_p = mgvbp_update.score_natural_gradient(
                self,
                state,
                self._blocks[0],
                tf.concat(thetas, 1),
                score_natural_gradient_diag,
                log_q_diag,
                step,
                writes,
            )
        elif self.curvature in FISHERS:
            mean_grad = -tf.concat([tf.reduce_sum(g, axis=0) for g in loss_grads], 0) / float(n)
            prior_precision = prior_vectors(
                self.view, range(len(self.view)), p.dtype, f"curvature='{self.curvature}'"
            )[1]
            records = mgvbp_update.records(self, step)
            fisher = fisher_diagonal(self.view, records, self.curvature, p.dtype)
            nat_mu = mean_grad / p
            nat_p = fisher + prior_precision / tf.cast(step.temperature, p.dtype) - p
        else:
            nat_mu, nat_p = reparam_natural_gradient_diag(
                thetas, mean, p, loss_grads, self._antithetic_for(n), ascent=False
            )
        nat_mu, nat_p = mgvbp_update.clip(self, nat_mu, nat_p, iteration)
        self._families[0].update(
            state, nat_mu, nat_p, *mgvbp_update.step_sizes(self, learning_rate, iteration), writes
        )
