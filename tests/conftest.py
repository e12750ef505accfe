import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    yield


def gaussian_target(dim, condition, seed):
    """The paper's Gaussian target family (Galy-Fajou et al. 2021's Gaussian experiments): Sigma = U diag(lam) U^T, U random orthogonal,
    log10 lam_i spaced evenly over [-1, log10(condition) - 1], mu ~ N(0, I)."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    lam = 10 ** (np.log10(condition) * np.arange(dim) / (dim - 1) - 1)
    sigma = u @ np.diag(lam) @ u.T
    mu = rng.standard_normal(dim)
    precision = np.linalg.inv(sigma)
    p, m = tf.constant(precision, tf.float32), tf.constant(mu, tf.float32)

    def log_prob(x):
        d = x - m
        return -0.5 * tf.reduce_sum(tf.matmul(d, p) * d, axis=1)

    return mu, sigma, lam, log_prob
