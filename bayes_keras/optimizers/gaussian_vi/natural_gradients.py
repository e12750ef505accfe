"""MGVBP (Magris, Shabani, Iosifidis): natural-gradient Gaussian VI on the precision matrix, as pure
tensor functions.

q = N(mu, P^-1). Notation (Magris, Shabani & Iosifidis, "Manifold Gaussian Variational Bayes on the Precision Matrix",
https://arxiv.org/abs/2210.14598): samples theta_s = mu + L^-T eps_s (P = L L^T),
a_s = theta_s - mu, S samples. Natural gradients of the lower bound L = E_q[log p(y, theta)] + H(q):

    mu:  Sigma grad_mu L                 P:  2 P (grad_P L) P = -2 grad_Sigma L

Update (ascent, xi the momentum in P's tangent space):
    mu <- mu + beta m_mu ;  P <- R_P(beta m_P),  R_P(xi) = P + xi + 1/2 xi P^-1 xi      (retraction)
    m  <- omega T(m) + (1 - omega) natural_gradient, T(m) = E m E^T, E = (P_new P_old^-1)^(1/2)
R_P(xi) = 1/2 P + 1/2 (P + xi) P^-1 (P + xi) is positive definite for ANY symmetric xi; the
Cholesky/eigenvalue check with step halving is only a guard against round-off.

"full" functions act on a (D,) mean and a (D, D) precision; "diag" functions on (D,) vectors p
(the diagonal structure: p <- p + xi + xi^2 / (2 p), transport m <- (p_new / p_old) m).
"""

import math

import tensorflow as tf

from bayes_keras.curvature.kfac import split_damping

_LOG_2PI_E = math.log(2.0 * math.pi) + 1.0


def symmetrize(a):
    return 0.5 * (a + tf.linalg.matrix_transpose(a))


# -- retraction, transport, guard ----------------------------------------------------------------
def retract_full(precision, xi, chol=None):
    """R_P(xi) = P + xi + 1/2 xi P^-1 xi (symmetrised). `chol`: P's Cholesky factor, if already known."""
    chol = tf.linalg.cholesky(precision) if chol is None else chol
    return symmetrize(precision + xi + 0.5 * tf.matmul(xi, tf.linalg.cholesky_solve(chol, xi)))


def retract_diag(p, xi):
    """Diagonal retraction p + xi + xi^2 / (2 p) = ((p + xi)^2 + p^2) / (2 p) > 0."""
    return p + xi + 0.5 * tf.square(xi) / p


def is_positive_definite_full(precision):
    """True when P is finite, symmetric-positive-definite to working precision (smallest eigenvalue > 0).

    An eigenvalue check rather than a Cholesky attempt: TF's CPU Cholesky raises instead of
    returning NaN on a non-PD input, which a compiled step cannot catch.
    """
    finite = tf.reduce_all(tf.math.is_finite(precision))
    safe = tf.where(finite, precision, tf.eye(tf.shape(precision)[0], dtype=precision.dtype))
    return finite & (tf.reduce_min(tf.linalg.eigvalsh(safe)) > 0)


def is_positive_definite_diag(p):
    return tf.reduce_all(tf.math.is_finite(p)) & tf.reduce_all(p > 0)


def retract_with_halving(precision, xi, retract, is_valid, max_halvings=5):
    """Try R_P(xi), R_P(xi / 2), ..., R_P(xi / 2^max_halvings); return the first valid one and its
    step factor, or (P unchanged, 0.0) when none is valid."""
    dtype = precision.dtype

    def cond(k, candidate, ok):
        return tf.logical_and(tf.logical_not(ok), k <= max_halvings)

    def body(k, candidate, ok):
        factor = tf.pow(tf.constant(0.5, dtype), tf.cast(k, dtype))
        candidate = retract(precision, factor * xi)
        return k + 1, candidate, is_valid(candidate)

    k, candidate, ok = tf.while_loop(cond, body, (tf.constant(0), precision, tf.constant(False)))
    factor = tf.where(
        ok, tf.pow(tf.constant(0.5, dtype), tf.cast(k - 1, dtype)), tf.constant(0.0, dtype)
    )
    return tf.where(ok, candidate, precision), factor


def _sqrt_and_inverse_sqrt(precision):
    w, u = tf.linalg.eigh(precision)
    w = tf.maximum(w, tf.reduce_max(w) * 1e-15)
    s = tf.sqrt(w)
    return tf.matmul(u * s, u, transpose_b=True), tf.matmul(u / s, u, transpose_b=True)


def transport_full(m, precision_old, precision_new):
    """Vector transport T(m) = E m E^T with E = (P_new P_old^-1)^(1/2), computed through the symmetric
    form E = P^1/2 (P^-1/2 P_new P^-1/2)^1/2 P^-1/2 (no non-symmetric matrix square root).
    T maps P_old itself to P_new."""
    root, inv_root = _sqrt_and_inverse_sqrt(precision_old)
    middle_root, _ = _sqrt_and_inverse_sqrt(
        symmetrize(tf.matmul(inv_root, tf.matmul(precision_new, inv_root)))
    )
    e = tf.matmul(root, tf.matmul(middle_root, inv_root))
    return symmetrize(tf.matmul(e, tf.matmul(m, e, transpose_b=True)))


def transport_diag(m, p_old, p_new):
    return m * (p_new / p_old)


# -- sampling and entropy ------------------------------------------------------------------------
def sample_full(mean, precision, eps):
    """theta = mu + L^-T eps for eps (S, D) standard normal: Cov(theta) = P^-1 without forming it."""
    chol = tf.linalg.cholesky(precision)
    z = tf.linalg.triangular_solve(tf.linalg.matrix_transpose(chol), tf.transpose(eps), lower=False)
    return mean[None, :] + tf.transpose(z)


def sample_diag(mean, p, eps):
    return mean[None, :] + eps / tf.sqrt(p)[None, :]


def entropy_full(precision):
    d = tf.cast(tf.shape(precision)[0], precision.dtype)
    logdet = 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(tf.linalg.cholesky(precision))))
    return -0.5 * logdet + 0.5 * d * _LOG_2PI_E


def entropy_diag(p):
    return tf.reduce_sum(-0.5 * tf.math.log(p) + 0.5 * _LOG_2PI_E)


def log_q_full(theta, mean, precision):
    """log N(theta_s; mu, P^-1) for theta (S, D)."""
    a = theta - mean[None, :]
    quad = tf.reduce_sum(tf.matmul(a, precision) * a, axis=1)
    half_logdet = tf.reduce_sum(tf.math.log(tf.linalg.diag_part(tf.linalg.cholesky(precision))))
    d = tf.cast(tf.shape(a)[1], a.dtype)
    return -0.5 * quad + half_logdet - 0.5 * d * math.log(2.0 * math.pi)


def log_q_diag(theta, mean, p):
    a = theta - mean[None, :]
    return tf.reduce_sum(
        -0.5 * p * tf.square(a) + 0.5 * tf.math.log(p) - 0.5 * math.log(2.0 * math.pi), axis=1
    )


# -- natural-gradient estimators -----------------------------------------------------------------
def _centred_cross_moment(a, g, transpose=False, antithetic=False):
    """Unbiased sample covariance Cov(a, g) = E[a g^T] (E[a] = 0): both factors centred by their sample
    means, divided by S - 1. Subtracting g's mean is a free control variate: far from the optimum
    the mean gradient dominates g, and mean_s a_s g_s^T would carry it as noise into the curvature.
    antithetic=True: the samples come in mirrored pairs (a_{s + S/2} = -a_s), so sum_s a_s = 0 exactly,
    centring g changes nothing, and the unbiased normaliser is S, not S - 1."""
    if not transpose:
        return diagonal_moments(a, g, antithetic)[1]
    s = tf.cast(tf.shape(a)[0], a.dtype)
    if antithetic:
        return tf.matmul(a, g, transpose_a=True) / s
    a = a - tf.reduce_mean(a, axis=0, keepdims=True)
    g = g - tf.reduce_mean(g, axis=0, keepdims=True)
    return tf.matmul(a, g, transpose_a=True) / (s - 1.0)


def diagonal_moments(a, g, antithetic=False):
    """Per coordinate, the sample mean of g and the unbiased centred covariance Cov(a, g) (see
    _centred_cross_moment) of (S, D) samples."""
    return diagonal_moments_from_sums(
        tf.reduce_sum(a, axis=0),
        tf.reduce_sum(g, axis=0),
        tf.reduce_sum(a * g, axis=0),
        a.shape[0],
        antithetic,
    )


def diagonal_moments_from_sums(sum_a, sum_g, sum_ag, num_samples, antithetic=False):
    """diagonal_moments from the sums over S samples, as sum_s a_s g_s - S a_bar g_bar: three passes over
    the samples instead of five (a = theta - mu is centred at the known mean, so a_bar is
    O(sigma / sqrt(S)) and the subtraction cancels nothing). The sums may be concatenated per-variable
    pieces (MGVBP's diagonal step)."""
    s = float(num_samples)
    mean_g = sum_g / s
    if antithetic:
        return mean_g, sum_ag / s
    return mean_g, (sum_ag - sum_a * mean_g) / (s - 1.0)


def reparam_natural_gradient_full(theta, mean, precision, grad_log_joint, antithetic=False):
    """Gradient (reparameterisation / Price-Stein) estimator, an extension for networks (not in the paper):
        nat_mu = Sigma mean_s g_s ;  nat_P = -sym(P Cov_s(a, g)) - P,
    using E[hess log p] = P E[a g^T] = P Cov(a, g) (Stein). g = grad log p(y, theta) (the log JOINT,
    prior included). Fixed point: mu where E[g] = 0, P = -E[hess log p]. Needs S >= 2 samples.
    antithetic: the samples are mirrored pairs (see _centred_cross_moment)."""
    chol = tf.linalg.cholesky(precision)
    nat_mu = tf.linalg.cholesky_solve(chol, tf.reduce_mean(grad_log_joint, axis=0)[:, None])[:, 0]
    cross = _centred_cross_moment(
        theta - mean[None, :], grad_log_joint, transpose=True, antithetic=antithetic
    )
    neg_hessian = -symmetrize(tf.matmul(precision, cross))
    return nat_mu, neg_hessian - precision


def reparam_natural_gradient_diag(theta, mean, p, grad_log_joint, antithetic=False):
    """The diagonal `reparam_natural_gradient_full`: nat_mu = E[g] / p, nat_p = -p E[a g] - p (a = theta - mu,
    elementwise). The diagonal optimizer computes the same from per-variable sums
    (`diagonal_moments_from_sums`); this readable form is what the tests compare it with."""
    mean_g, cross = diagonal_moments(theta - mean[None, :], grad_log_joint, antithetic)
    return mean_g / p, -p * cross - p


def control_variate(score, f):
    """Per-coordinate optimal baseline c_i = Cov(score_i f, score_i) / Var(score_i) for score (S, ...) and
    f (S,), both moments over the S samples with the same normalisation. (The authors' code writes it
    (mean(A B) - mean(A) mean(B)) / var(B) * S / (S - 1) with MATLAB's var normalised by S - 1: the same
    ratio.)"""
    f = tf.reshape(f, [-1] + [1] * (len(score.shape) - 1))
    sf = score * f
    cov = tf.reduce_mean((sf - tf.reduce_mean(sf, 0)) * (score - tf.reduce_mean(score, 0)), axis=0)
    var = tf.reduce_mean(tf.square(score - tf.reduce_mean(score, 0)), axis=0)
    return tf.math.divide_no_nan(cov, var)


def score_natural_gradient_full(
    theta, mean, precision, f, c_mu, c_p, prior_mean=None, prior_precision=None
):
    """Score-function (black-box) estimators of the paper, full precision.

    With prior_precision None (estimator "h"): f_s = h(theta_s) = log p(y, theta_s) - log q(theta_s),
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
    nat_p = symmetrize(tf.reduce_mean(score_p * (f[:, None, None] - c_p[None]), axis=0))
    if prior_precision is not None:
        chol = tf.linalg.cholesky(precision)
        nat_mu += -tf.linalg.cholesky_solve(chol, (prior_precision * (mean - prior_mean))[:, None])[
            :, 0
        ]
        nat_p += tf.linalg.diag(prior_precision) - precision
    return nat_mu, nat_p, control_variate(a, f), control_variate(score_p, f)


def score_natural_gradient_diag(
    theta, mean, p, f, c_mu, c_p, prior_mean=None, prior_precision=None
):
    """Diagonal form of `score_natural_gradient_full`: score of p_i is p_i - p_i^2 a_i^2."""
    a = theta - mean[None, :]
    score_p = p[None, :] - tf.square(p[None, :] * a)
    nat_mu = tf.reduce_mean(a * (f[:, None] - c_mu[None, :]), axis=0)
    nat_p = tf.reduce_mean(score_p * (f[:, None] - c_p[None, :]), axis=0)
    if prior_precision is not None:
        nat_mu += -prior_precision * (mean - prior_mean) / p
        nat_p += prior_precision - p
    return nat_mu, nat_p, control_variate(a, f), control_variate(score_p, f)


def clip_by_norm(nat_mu, nat_p, max_norm):
    """Scale the stacked estimate (nat_mu, nat_P) down to norm max_norm (the paper's GradientMax)."""
    norm = tf.sqrt(tf.reduce_sum(tf.square(nat_mu)) + tf.reduce_sum(tf.square(nat_p)))
    scale = tf.minimum(tf.constant(1.0, nat_mu.dtype), max_norm / tf.maximum(norm, 1e-30))
    return nat_mu * scale, nat_p * scale


# -- Kronecker-factored precision: P = A (x) G over a (p, q) weight matrix, row-major vec -----------
# (the structure="kronecker" blocks: Noisy-KFAC's family, Zhang et al. 2018, moved by MGVBP's
# retraction applied to each factor).
def balance_factors(a, g):
    """Rescale (A, G) -> (c A, G / c) so that both have the same mean eigenvalue; A (x) G is unchanged.
    Keeps the split of the product between the factors canonical, so that factor-wise updates of
    state and target pairs compare like with like."""
    p = tf.cast(tf.shape(a)[0], a.dtype)
    q = tf.cast(tf.shape(g)[0], g.dtype)
    c = tf.sqrt(
        tf.maximum(tf.linalg.trace(g) / q, 1e-300) / tf.maximum(tf.linalg.trace(a) / p, 1e-300)
    )
    return a * c, g / c


def damped_kronecker_factors(a, g, damping):
    """The Kronecker product X (x) Y nearest in Frobenius norm to A (x) G + D (x) I (Van Loan and Pitsianis
    1993), returned balanced: the precision that a Kronecker-factored posterior can hold closest to the
    KFAC curvature plus the prior precision. `damping` is a number (D = damping I) or a (p,) vector of
    each row's precision (D = diag(damping): a layer's kernel rows and its bias row have their own priors).

    Under the rearrangement R(X (x) Y) = vec(X) vec(Y)^T the target is vec(A) vec(G)^T + vec(D) vec(I_q)^T,
    of rank 2, so its best rank-1 approximation lies in span{A, D} x span{G, I}: X = s (alpha_1 A +
    alpha_2 D), Y = beta_1 G + beta_2 I, from the SVD of the 2 x 2 matrix L_u^T L_v (L_u, L_v Cholesky
    factors of the Gram matrices of {vec A, vec D} and {vec G, vec I}). Exact when a factor is 1 x 1 (or a
    multiple of I): then the target itself is a Kronecker product, e.g. (g A + D) (x) 1. KFAC's factored
    damping (A + pi sqrt(damping) I) (x) (G + sqrt(damping) / pi I) adds the positive cross terms
    sqrt(damping) (A / pi (x) I + pi I (x) G) and so over-states the precision (on conjugate regression it
    shrank the marginal sds to 0.89-0.92 of the exact posterior's and an unexcited weight's sd to a
    quarter); it remains the fallback (with D's mean as the damping) if the nearest product is not
    positive definite (not seen for PSD A, G)."""
    p, q = a.shape[-1], g.shape[-1]
    # a number is converted in a's dtype (not rounded through float32), a tensor cast
    lam = tf.cast(damping, a.dtype) if tf.is_tensor(damping) else tf.constant(damping, a.dtype)
    rows = tf.broadcast_to(lam, (p,))
    d = tf.linalg.diag(rows)
    eye_q = tf.eye(q, dtype=g.dtype)
    if q == 1:
        return balance_factors(g[0, 0] * a + d, tf.ones((1, 1), g.dtype))
    if p == 1:
        return balance_factors(tf.ones((1, 1), a.dtype), a[0, 0] * g + rows[0] * eye_q)

    def gram(m, n):
        k = tf.stack(
            [
                tf.stack([tf.reduce_sum(m * m), tf.reduce_sum(m * n)]),
                tf.stack([tf.reduce_sum(m * n), tf.reduce_sum(n * n)]),
            ]
        )
        # a relative ridge keeps the Cholesky defined when the factor is a multiple of the other (rank 1)
        return k + 1e-12 * tf.linalg.trace(k) * tf.eye(2, dtype=m.dtype)

    l_u, l_v = tf.linalg.cholesky(gram(a, d)), tf.linalg.cholesky(gram(g, eye_q))
    s, w, z = tf.linalg.svd(tf.matmul(l_u, l_v, transpose_a=True))
    alpha = tf.linalg.triangular_solve(l_u, w[:, :1], lower=True, adjoint=True)[:, 0]  # L_u^-T w
    beta = tf.linalg.triangular_solve(l_v, z[:, :1], lower=True, adjoint=True)[:, 0]
    sign = tf.where(
        alpha[1] < 0, -tf.ones((), a.dtype), tf.ones((), a.dtype)
    )  # the pair's joint sign
    alpha, beta = sign * alpha, sign * beta
    x = s[0] * (alpha[0] * a + alpha[1] * d)
    y = beta[0] * g + beta[1] * eye_q
    positive = tf.reduce_all(alpha >= 0) & tf.reduce_all(beta >= 0) & (alpha[1] > 0) & (beta[1] > 0)
    c_a, c_g = split_damping(a, g, tf.reduce_mean(rows))
    x = tf.where(positive, x, a + c_a * tf.eye(p, dtype=a.dtype))
    y = tf.where(positive, y, g + c_g * eye_q)
    return balance_factors(x, y)


def sample_kronecker(mean, chol_a, chol_g, eps):
    """theta = mu + vec(L_A^-T E L_G^-1) for eps (S, p*q): Cov = A^-1 (x) G^-1 = P^-1 (row-major vec)."""
    p, q = chol_a.shape[0], chol_g.shape[0]
    eye_p = tf.eye(p, dtype=chol_a.dtype)
    eye_q = tf.eye(q, dtype=chol_g.dtype)
    left = tf.linalg.matrix_transpose(
        tf.linalg.triangular_solve(chol_a, eye_p, lower=True)
    )  # L_A^-T
    right = tf.linalg.triangular_solve(chol_g, eye_q, lower=True)  # L_G^-1
    e = tf.reshape(eps, (-1, p, q))
    z = tf.einsum("ij,sjk,kl->sil", left, e, right)
    return mean[None, :] + tf.reshape(z, (-1, p * q))


def kronecker_solve(chol_a, chol_g, v):
    """P^-1 v = vec(A^-1 V G^-1) for v (p*q,) (V its row-major (p, q) matrix)."""
    p, q = chol_a.shape[0], chol_g.shape[0]
    x = tf.linalg.cholesky_solve(chol_a, tf.reshape(v, (p, q)))
    x = tf.linalg.matrix_transpose(tf.linalg.cholesky_solve(chol_g, tf.linalg.matrix_transpose(x)))
    return tf.reshape(x, (p * q,))


def entropy_kronecker(chol_a, chol_g):
    """Entropy of N(mu, (A (x) G)^-1): log det (A (x) G) = q log det A + p log det G."""
    p = tf.cast(chol_a.shape[0], chol_a.dtype)
    q = tf.cast(chol_g.shape[0], chol_g.dtype)
    logdet = 2.0 * (
        q * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol_a)))
        + p * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol_g)))
    )
    return -0.5 * logdet + 0.5 * p * q * _LOG_2PI_E
