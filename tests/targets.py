"""Targets with known answers, shared by the test modules (import as `from targets import ...`), and
the tolerance helpers that compare estimates with them."""

import os

import keras
import numpy as np
import tensorflow as tf

import bayes_keras as bk
from paths import FIXTURES


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


# -- small models and data ---------------------------------------------------------------------------
def tiny_classifier(n_particles=4, classes=3, d=5):
    """Dense(8, tanh) -> Dense(classes) particle classifier with a categorical likelihood."""
    inputs = keras.Input((d,))
    h = bk.layers.Dense(8, activation="tanh", num_particles=n_particles)(inputs)
    out = bk.layers.Dense(classes)(h)
    return bk.BayesianModel(inputs, out, likelihood="categorical")


def class_data(n=64, classes=3, d=5, seed=0):
    """Gaussian inputs labelled by the argmax of their first `classes` coordinates."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    y = (np.argmax(x[:, :classes], 1)).astype(np.int32)
    return x, y


def correlated_gaussian_2d():
    """(mu, sigma, log_prob) of the correlated 2-D Gaussian target (correlation 1.2 / sqrt(3))."""
    sigma = np.array([[2.0, 1.2], [1.2, 1.5]])
    mu = np.array([1.0, -2.0])
    prec = tf.constant(np.linalg.inv(sigma), tf.float32)

    def log_prob(x):
        z = x - mu.astype(np.float32)
        return -0.5 * tf.reduce_sum(tf.matmul(z, prec) * z, axis=1)

    return mu, sigma, log_prob


def correlated_linear_data(noise):
    """Linear-regression data whose inputs are strongly correlated (a far-from-diagonal posterior)."""
    x, y = linear_data(noise=noise)
    return (x @ np.array([[1.0, 0.9, 0.6], [0.0, 0.4, 0.3], [0.0, 0.0, 0.4]])).astype(np.float32), y


# -- breast_cancer logistic regression and its long-run NUTS posterior (tests/fixtures) ---------------
NUTS_FIXTURE = os.path.join(FIXTURES, "breast_cancer_nuts.npz")
NUTS_MEAN_TOL = 0.1  # in NUTS posterior standard deviations
NUTS_SD_TOL = 0.15  # relative error of the marginal standard deviation


def breast_cancer_nuts():
    """{"mean", "sd", ...} of the NUTS reference posterior (see test_gpf_nuts for how it was run)."""
    ref = np.load(NUTS_FIXTURE)
    return {k: ref[k] for k in ref.files}


def breast_cancer_log_prob():
    """(N, 31) -> (N,): Bernoulli log likelihood + N(0, I) log prior (up to a constant), bias column added."""
    (x, y), _ = bk.datasets.load_breast_cancer(test_fraction=0.0, add_bias=True)
    x = tf.constant(x)
    y = tf.constant(y.astype(np.float32))

    def log_prob(w):
        logits = tf.matmul(w, x, transpose_b=True)  # (N, 569)
        return tf.reduce_sum(y * logits - tf.math.softplus(logits), axis=1) - 0.5 * tf.reduce_sum(
            w * w, axis=1
        )

    return log_prob


def run_gpf_breast_cancer(
    num_steps, num_particles=256, seed=0, learning_rate=1.5e-2, step_rule="sgd", init_spread=0.1
):
    """Full-covariance GPF on `breast_cancer_log_prob` through the functional door."""
    init = init_spread * np.random.default_rng(seed).standard_normal((num_particles, 31)).astype(
        np.float32
    )
    opt = bk.optimizers.GaussianParticleFlow(
        learning_rate, structure="full", step_rule=step_rule, mean_preconditioning=False
    )
    return bk.run_particles(breast_cancer_log_prob(), init, opt, num_steps)


# -- tolerances ----------------------------------------------------------------------------------------
def assert_within_sampling_error(estimate, truth, standard_error, z=4.0, what="estimate"):
    """Assert |estimate - truth| <= z * standard_error elementwise: a Monte Carlo estimate agrees with an
    exact value to its sampling error (z = 4: a false alarm about once in 16,000 coordinates)."""
    estimate, truth = np.asarray(estimate, np.float64), np.asarray(truth, np.float64)
    bound = z * np.broadcast_to(np.asarray(standard_error, np.float64), np.shape(truth))
    gap = np.abs(estimate - truth)
    worst = int(np.argmax(gap / np.maximum(bound, 1e-300)))
    assert np.all(gap <= bound), (
        f"{what}: {np.sum(gap > bound)} of {gap.size} coordinates beyond {z} standard "
        f"errors; worst at {worst}: {estimate.ravel()[worst]:.6g} vs "
        f"{truth.ravel()[worst]:.6g} (se {bound.ravel()[worst] / z:.3g})"
    )


def assert_sample_moments(samples, mean, sd, z=4.0, what="samples"):
    """Independent draws (S, D) have the given marginal means and standard deviations to sampling error:
    the mean's standard error is sd / sqrt(S), the sample sd's about sd / sqrt(2 S) (Gaussian draws)."""
    samples = np.asarray(samples, np.float64).reshape(len(samples), -1)
    s = len(samples)
    mean, sd = np.ravel(mean), np.ravel(sd)
    assert_within_sampling_error(samples.mean(0), mean, sd / np.sqrt(s), z, f"{what} mean")
    assert_within_sampling_error(samples.std(0, ddof=1), sd, sd / np.sqrt(2 * s), z, f"{what} sd")


# -- serialisation -------------------------------------------------------------------------------------
def keras_round_trip(obj, tmp_path, name="round_trip"):
    """Save `obj` (a model: .keras file; any other Keras-serialisable object: its serialised config, as
    Keras writes it into a .keras file) and load it back."""
    if isinstance(obj, keras.Model):
        path = os.path.join(str(tmp_path), f"{name}.keras")
        obj.save(path)
        return keras.saving.load_model(path)
    return keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(obj))
