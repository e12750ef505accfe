"""Distances between a particle approximation and a known posterior, as the PFBR paper measures them
(Chen, Dai & Song 2019, https://arxiv.org/abs/1902.00640, Section 5 and Appendix C)."""

import math

import numpy as np


def effective_sample_size(weights):
    """Kish's effective sample size (sum w)^2 / sum w^2 of importance weights (..., N) (any scale)."""
    weights = np.asarray(weights, np.float64)
    return np.sum(weights, axis=-1) ** 2 / np.sum(weights**2, axis=-1)


def _normalized_weights(weights, num):
    """Validated weights (N,) summing to one, or None for an equally weighted cloud."""
    if weights is None:
        return None
    weights = np.asarray(weights, np.float64)
    if weights.shape != (num,):
        raise ValueError(
            f"weights must have shape ({num},), one per particle; got {weights.shape}."
        )
    if not (np.all(np.isfinite(weights)) and np.all(weights >= 0) and weights.sum() > 0):
        raise ValueError("weights must be finite, non-negative and not all zero.")
    return weights / weights.sum()


def weighted_moments(particles, weights=None):
    """(mean (d,), sd (d,)) of a particle cloud (N, d), weighted by `weights` (N,) if given. The sd uses
    the unbiased weighted variance sum w (x - m)^2 / (1 - sum w^2) (w normalised), which is the usual
    N - 1 estimate for equal weights."""
    particles = np.asarray(particles, np.float64)
    w = _normalized_weights(weights, particles.shape[0])
    if w is None:
        return particles.mean(0), particles.std(0, ddof=1)
    mean = w @ particles
    variance = w @ (particles - mean) ** 2 / max(1.0 - float(np.sum(w**2)), 1e-12)
    return mean, np.sqrt(variance)


def silverman_bandwidth(particles, weights=None):
    """Per-coordinate Gaussian KDE bandwidth (4 / (d + 2))^(1 / (d + 4)) n^(-1 / (d + 4)) std(X): the rule
    the paper's KDE uses, with n = N. particles (..., N, d) -> (..., 1, d). For a weighted cloud
    (`weights` (N,), an importance sampler's), std is the weighted sd and n the effective sample size
    (sum w)^2 / sum w^2: the bandwidth of an equally weighted cloud of that many independent draws, not
    of N points of which many are near copies."""
    particles = np.asarray(particles, np.float64)
    n, d = particles.shape[-2:]
    if weights is not None:
        if particles.ndim != 2:
            raise ValueError(
                f"silverman_bandwidth: weights need one cloud (N, d); got particles of shape {particles.shape}."
            )
        w = _normalized_weights(weights, n)
        factor = (4.0 / (d + 2)) ** (1.0 / (d + 4)) * float(effective_sample_size(w)) ** (
            -1.0 / (d + 4)
        )
        mean = w @ particles
        return factor * np.sqrt(w @ (particles - mean) ** 2)[None, :] + 1e-12  # as np.std: no N - 1
    factor = (4.0 / (d + 2)) ** (1.0 / (d + 4)) * n ** (-1.0 / (d + 4))
    return factor * particles.std(axis=-2, keepdims=True) + 1e-12


def kde_log_density(particles, points, bandwidth=None, weights=None):
    """log of the Gaussian KDE of `particles` (N, d) at `points` (M, d), float64. With `weights` (N,) the
    KDE is the weighted mixture sum_i w_i N(x_i, h^2) (an importance sampler's cloud scored as weighted),
    its default bandwidth Silverman's rule at the effective sample size."""
    particles = np.asarray(particles, np.float64)
    w = _normalized_weights(weights, particles.shape[0])
    if bandwidth is None:
        h = silverman_bandwidth(particles, w)[0]
    else:
        h = np.broadcast_to(np.asarray(bandwidth, np.float64), particles.shape[-1:])
    log_w = (
        -np.log(particles.shape[0]) * np.ones(particles.shape[0])
        if w is None
        else np.log(np.maximum(w, 1e-300))
    )
    if w is not None:
        keep = w > 0
        particles, log_w = particles[keep], log_w[keep]
    # log sum_i w_i N(x; x_i, diag h^2) through ||(x - x_i) / h||^2 = |x/h|^2 + |x_i/h|^2 - 2 (x/h).(x_i/h):
    # one matrix product per block of points, never an (M, N, d) array.
    centres = particles / h
    norms = np.sum(centres**2, axis=1)
    constant = -np.sum(np.log(h)) - 0.5 * particles.shape[1] * np.log(2 * np.pi)
    points = np.asarray(points, np.float64)
    out = np.empty(points.shape[0])
    for start in range(0, points.shape[0], 1024):
        x = points[start : start + 1024] / h
        squared = np.maximum(
            np.sum(x**2, axis=1)[:, None] + norms[None, :] - 2 * x @ centres.T, 0.0
        )
        logits = log_w[None, :] - 0.5 * squared
        top = logits.max(axis=1, keepdims=True)
        out[start : start + 1024] = (
            top[:, 0] + np.log(np.sum(np.exp(logits - top), axis=1))
        ) + constant
    return out


def kde_cross_entropy(particles, target_samples, bandwidth=None, weights=None):
    """-E_p[log q_hat(x)] with q_hat the Gaussian KDE of `particles` (N, d) (weighted by `weights` (N,)
    if given: see `kde_log_density`) and x the draws `target_samples` (M, d) of the true posterior p (the
    paper uses M = 5000): the paper's main metric. Its minimum over q_hat is p's entropy; even N exact
    draws of p stay above it by the KDE's smoothing, by less the larger N is, so a cloud is compared with
    exact draws of its own size."""
    return float(-np.mean(kde_log_density(particles, target_samples, bandwidth, weights)))


def mmd_squared(x, y, bandwidth=None):
    """Unbiased squared maximum mean discrepancy between samples x (N, d) and y (M, d) with the Gaussian
    kernel exp(-|a - b|^2 / (2 bandwidth^2)) (Gretton et al. 2012); bandwidth defaults to the median
    distance of the pooled samples."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(
            f"mmd_squared expects samples x (N, d) and y (M, d); got shapes {x.shape} and {y.shape}."
        )
    if len(x) < 2 or len(y) < 2:
        raise ValueError(
            f"mmd_squared's unbiased estimate needs at least 2 samples on each side; got {len(x)} and "
            f"{len(y)}."
        )
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("mmd_squared: the samples contain NaN or Inf.")

    def sq(a, b):
        return np.maximum(np.sum(a**2, 1)[:, None] + np.sum(b**2, 1)[None, :] - 2 * a @ b.T, 0.0)

    if bandwidth is None:
        pooled = np.concatenate([x, y])[:1000]
        bandwidth = math.sqrt(0.5 * np.median(sq(pooled, pooled)[np.triu_indices(len(pooled), 1)]))
    kxx, kyy, kxy = (np.exp(-sq(a, b) / (2 * bandwidth**2)) for a, b in ((x, x), (y, y), (x, y)))
    n, m = len(x), len(y)
    return float(
        (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
        + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        - 2 * kxy.mean()
    )


def gaussian_integral_discrepancies(particles, mean, covariance, seed=0):
    """|E_p[g] - (1/N) sum_i g(x_i)| for the paper's test functions under a Gaussian posterior
    p = N(mean, covariance), whose expectations are closed-form: g(x) = x (averaged over coordinates),
    x^T A x (= tr(A S) + m^T A m) and (A x + a)^T (B x + b) (= tr(A^T B S) + (A m + a)^T (B m + b)),
    A, B, a, b standard normal draws fixed by `seed`."""
    x = np.asarray(particles, np.float64)
    m, s = np.asarray(mean, np.float64), np.asarray(covariance, np.float64)
    d = x.shape[-1]
    rng = np.random.default_rng(seed)
    a_mat, b_mat, a_vec, b_vec = (
        rng.normal(size=(d, d)),
        rng.normal(size=(d, d)),
        rng.normal(size=d),
        rng.normal(size=d),
    )
    quadratic = np.einsum("ni,ij,nj->n", x, a_mat, x).mean()
    bilinear = np.sum((x @ a_mat.T + a_vec) * (x @ b_mat.T + b_vec), axis=1).mean()
    return {
        "mean": float(np.abs(x.mean(0) - m).mean()),
        "quadratic": float(abs(quadratic - (np.trace(a_mat @ s) + m @ a_mat @ m))),
        "bilinear": float(
            abs(
                bilinear
                - (np.trace(a_mat.T @ b_mat @ s) + (a_mat @ m + a_vec) @ (b_mat @ m + b_vec))
            )
        ),
    }
