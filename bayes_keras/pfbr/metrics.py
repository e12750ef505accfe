"""Distances between a particle approximation and a known posterior, as the PFBR paper measures them
(Chen, Dai & Song 2019, https://arxiv.org/abs/1902.00640, Section 5 and Appendix C)."""

import math

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp


def silverman_bandwidth(particles):
    """Per-coordinate Gaussian KDE bandwidth (4 / (d + 2))^(1 / (d + 4)) N^(-1 / (d + 4)) std(X): the rule
    the paper's KDE uses. particles (..., N, d) -> (..., 1, d)."""
    particles = np.asarray(particles, np.float64)
    n, d = particles.shape[-2:]
    factor = (4.0 / (d + 2)) ** (1.0 / (d + 4)) * n ** (-1.0 / (d + 4))
    return factor * particles.std(axis=-2, keepdims=True) + 1e-12


def kde_log_density(particles, points, bandwidth=None):
    """log of the Gaussian KDE of `particles` (N, d) at `points` (M, d), float64."""
    particles = np.asarray(particles, np.float64)
    h = silverman_bandwidth(particles)[0] if bandwidth is None else np.broadcast_to(np.asarray(bandwidth, np.float64), particles.shape[-1:])
    kde = tfp.distributions.MixtureSameFamily(
        tfp.distributions.Categorical(logits=tf.zeros([particles.shape[0]], tf.float64)),
        tfp.distributions.MultivariateNormalDiag(loc=particles, scale_diag=tf.broadcast_to(h, particles.shape)))
    return kde.log_prob(tf.constant(np.asarray(points, np.float64))).numpy()


def kde_cross_entropy(particles, target_samples, bandwidth=None):
    """-E_p[log q_hat(x)] with q_hat the Gaussian KDE of `particles` (N, d) and x the draws
    `target_samples` (M, d) of the true posterior p (the paper uses M = 5000): the paper's main metric.
    Its minimum over q_hat is p's entropy; even N exact draws of p stay above it by the KDE's smoothing."""
    return float(-np.mean(kde_log_density(particles, target_samples, bandwidth)))


def mmd_squared(x, y, bandwidth=None):
    """Unbiased squared maximum mean discrepancy between samples x (N, d) and y (M, d) with the Gaussian
    kernel exp(-|a - b|^2 / (2 bandwidth^2)) (Gretton et al. 2012); bandwidth defaults to the median
    distance of the pooled samples."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"mmd_squared expects samples x (N, d) and y (M, d); got shapes {x.shape} and {y.shape}.")
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"mmd_squared's unbiased estimate needs at least 2 samples on each side; got {len(x)} and "
                         f"{len(y)}.")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("mmd_squared: the samples contain NaN or Inf.")

    def sq(a, b):
        return np.maximum(np.sum(a**2, 1)[:, None] + np.sum(b**2, 1)[None, :] - 2 * a @ b.T, 0.0)

    if bandwidth is None:
        pooled = np.concatenate([x, y])[:1000]
        bandwidth = math.sqrt(0.5 * np.median(sq(pooled, pooled)[np.triu_indices(len(pooled), 1)]))
    kxx, kyy, kxy = (np.exp(-sq(a, b) / (2 * bandwidth**2)) for a, b in ((x, x), (y, y), (x, y)))
    n, m = len(x), len(y)
    return float((kxx.sum() - np.trace(kxx)) / (n * (n - 1)) + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
                 - 2 * kxy.mean())


def gaussian_integral_discrepancies(particles, mean, covariance, seed=0):
    """|E_p[g] - (1/N) sum_i g(x_i)| for the paper's test functions under a Gaussian posterior
    p = N(mean, covariance), whose expectations are closed-form: g(x) = x (averaged over coordinates),
    x^T A x (= tr(A S) + m^T A m) and (A x + a)^T (B x + b) (= tr(A^T B S) + (A m + a)^T (B m + b)),
    A, B, a, b standard normal draws fixed by `seed`."""
    x = np.asarray(particles, np.float64)
    m, s = np.asarray(mean, np.float64), np.asarray(covariance, np.float64)
    d = x.shape[-1]
    rng = np.random.default_rng(seed)
    a_mat, b_mat, a_vec, b_vec = rng.normal(size=(d, d)), rng.normal(size=(d, d)), rng.normal(size=d), rng.normal(size=d)
    quadratic = np.einsum("ni,ij,nj->n", x, a_mat, x).mean()
    bilinear = np.sum((x @ a_mat.T + a_vec) * (x @ b_mat.T + b_vec), axis=1).mean()
    return {"mean": float(np.abs(x.mean(0) - m).mean()),
            "quadratic": float(abs(quadratic - (np.trace(a_mat @ s) + m @ a_mat @ m))),
            "bilinear": float(abs(bilinear - (np.trace(a_mat.T @ b_mat @ s) + (a_mat @ m + a_vec) @ (b_mat @ m + b_vec))))}
