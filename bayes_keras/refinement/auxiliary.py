"""Closed forms of local refinement with auxiliary variables (Havasi et al. 2021, App. A), per coordinate.

Notation (all arrays broadcast elementwise): the prior is w ~ N(b_0, s_0^2) and w = b_0 + a_1 + ... + a_K
with independent a_k ~ N(0, sigma_k^2), sum_k sigma_k^2 = s_0^2 - s_K^2. After k auxiliary draws
b_k = b_0 + a_1 + ... + a_k and the conditional prior is p(w | a_1..a_k) = N(b_k, s_k^2),
s_k^2 = s_{k-1}^2 - sigma_k^2. The current variational posterior is q(w) = N(nu, rho^2).

Two-step sampling (w ~ q, then a_k ~ p(a_k | a_<k, w)) is the same joint distribution as
a_k ~ q(a_k) (`auxiliary_distribution`) followed by w ~ q(w | a_k) (`conditional_posterior`), which is
what makes refinement start every stage exactly where the previous one left off in expectation.
"""

import numpy as np


def variance_schedule(num_stages, ratio=0.7, variances=None):
    """Fractions sigma_k^2 / s_0^2 of the prior variance taken by each auxiliary variable.

    ratio: each a_k takes `ratio` of the variance still left, sigma_k^2 = ratio (1 - ratio)^(k-1) s_0^2,
        leaving (1 - ratio)^K s_0^2 to the last conditional posterior (the paper: 0.7).
    variances: an explicit schedule instead, K fractions in (0, 1] summing to at most 1. A sum of 1 is the
        paper's exact split w = a_1 + ... + a_K (e.g. its toy's (0.8, 0.2)): the last conditional
        posterior is then the point b_K, and the sample is w = b_K.
    """
    if isinstance(num_stages, bool) or int(num_stages) != num_stages or num_stages < 1:
        raise ValueError(f"num_stages must be a positive integer; got {num_stages!r}.")
    if variances is not None:
        fractions = np.asarray(variances, dtype=np.float64)
        if (
            fractions.shape != (int(num_stages),)
            or np.any(fractions <= 0)
            or not fractions.sum() <= 1.0 + 1e-12
        ):
            raise ValueError(
                f"variances must be {int(num_stages)} positive fractions of the prior variance summing "
                f"to at most 1; got {variances!r} (sum {fractions.sum():g})."
            )
        if abs(fractions.sum() - 1.0) <= 1e-12:
            fractions[-1] = 1.0 - fractions[:-1].sum()  # exactly nothing left
        return fractions
    if isinstance(ratio, bool) or not 0.0 < float(ratio) < 1.0:
        raise ValueError(f"The variance ratio must be in (0, 1); got {ratio!r}.")
    k = np.arange(int(num_stages))
    return float(ratio) * (1.0 - float(ratio)) ** k


def auxiliary_distribution(nu, rho2, b_prev, s2_prev, sigma2):
    """q(a_k) = N(mean, var): the distribution of a_k when w ~ q and a_k ~ p(a_k | a_<k, w).

    p(a_k | a_<k, w) = N(c (w - b_prev), c s_k^2) with c = sigma_k^2 / s_{k-1}^2, so
    mean = c (nu - b_prev), var = c s_k^2 + c^2 rho^2."""
    c = sigma2 / s2_prev
    s2 = s2_prev - sigma2
    return c * (nu - b_prev), c * s2 + c * c * rho2


def conditional_posterior(a, nu, rho2, b_prev, s2_prev, sigma2):
    """q(w | a_k) = N(mean, var), the warm start of stage k: q(w) conditioned on a_k (Gaussian conditioning).

    var = rho^2 s_{k-1}^2 s_k^2 / (sigma_k^2 rho^2 + s_{k-1}^2 s_k^2),
    mean = (a rho^2 s_{k-1}^2 + b_prev sigma_k^2 rho^2 + nu s_k^2 s_{k-1}^2) / (sigma_k^2 rho^2 + s_{k-1}^2 s_k^2)."""
    s2 = s2_prev - sigma2
    denominator = sigma2 * rho2 + s2_prev * s2
    mean = (a * rho2 * s2_prev + b_prev * sigma2 * rho2 + nu * s2 * s2_prev) / denominator
    return mean, rho2 * s2_prev * s2 / denominator


def normal_log_prob(x, mean, var):
    """Elementwise log N(x; mean, var)."""
    return -0.5 * (np.log(2.0 * np.pi * var) + (x - mean) ** 2 / var)


def normal_kl(mean_q, var_q, mean_p, var_p):
    """Elementwise KL(N(mean_q, var_q) || N(mean_p, var_p)); 0 where both are the same point (var_p = 0 after
    an exact split: q is then the point mass at mean_p too)."""
    var_q, var_p = np.asarray(var_q, np.float64), np.asarray(var_p, np.float64)
    point = var_p == 0
    safe_q, safe_p = np.where(point, 1.0, var_q), np.where(point, 1.0, var_p)
    kl = 0.5 * (np.log(safe_p / safe_q) + (safe_q + (mean_q - mean_p) ** 2) / safe_p - 1.0)
    return np.where(point, 0.0, kl)
