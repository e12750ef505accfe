"""Targets with known answers, shared by the test modules (import as `from targets import ...`)."""

import keras
import numpy as np

import bayes_keras as bk


def linear_data(n=60, d=3, noise=0.5, seed=0):
    """Linear-regression data y = x w + 0.3 + noise * eps (float32)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal(d)
    y = (x @ w + 0.3 + noise * rng.standard_normal(n)).astype(np.float32)
    return x, y


def linear_model(d, num_particles, likelihood):
    """One particle Dense(1) with N(0, 1) priors on kernel and bias: a conjugate model under a Normal
    likelihood of known scale."""
    inputs = keras.Input((d,))
    out = bk.layers.Dense(1, num_particles=num_particles, kernel_prior=1.0, bias_prior=1.0)(inputs)
    return bk.BayesianModel(inputs, out, likelihood=likelihood)


def exact_linear_posterior(x, y, noise):
    """Conjugate Bayesian linear regression, prior N(0, I) on [w, b]: (mean, covariance) in float64."""
    xb = np.concatenate([x, np.ones((len(x), 1))], 1).astype(np.float64)
    precision = xb.T @ xb / noise**2 + np.eye(xb.shape[1])
    cov = np.linalg.inv(precision)
    return cov @ xb.T @ y.astype(np.float64) / noise**2, cov


def linear_particles(model):
    """The (N, d + 1) particles [w, b] of `linear_model`."""
    k, b = model.particle_variables
    return np.concatenate([k.numpy()[:, :, 0], b.numpy()], 1)


def paper_mgvbp(learning_rate=1e-2, **kwargs):
    """MGVBP with the paper's settings (momentum 0.4, P0 = 10 I, one step size for mu and P), which the
    tests of its math use; the library's defaults are tuned for networks instead."""
    settings = {"momentum": 0.4, "initial_precision": 10.0, "mean_learning_rate": None}
    settings.update(kwargs)
    return bk.optimizers.MGVBP(learning_rate, **settings)
