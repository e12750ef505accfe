"""Defaults on the seeds' own kind of experiment: full-batch Bayesian logistic regression (breast_cancer,
standardised + bias, D = 31, prior N(0, I), Bernoulli likelihood) through model.fit, every optimizer built
with no arguments except structure / mode, against the long NUTS run of tests/fixtures/breast_cancer_nuts.npz.
Errors are those of the WORST coordinate: |mean - mean_nuts| / sd_nuts and sd / sd_nuts.

Measured (seed 0, this file's configurations):
- MatrixSVGD() (N = 100): worst mean error 0.68 after 100 steps and 0.32 after 300, where SVGD() is at 1.22
  and 0.32 (with the signal share's decay 0.9 instead of 0.97: 0.37 and 0.32): ahead at 100 steps, a tie at 300, where both have reached SVGD's finite-N fixed point (after 3,000
  steps: 0.32 vs 0.33; N = 100 particles in 31 dimensions collapse to sd ratios 0.13-0.55, so their mean
  sits between the MAP, up to 0.33 sd from the posterior mean, and the mean). The unscaled MatrixSVGD(0.1)
  of earlier releases was at 2.24 and 2.08.
- MGVBP(structure="full") (100 samples per step): worst mean error 0.024 and sd ratios 0.960-1.000 after 3,000
  steps, the exact optimal Gaussian's 0.025 / 0.959-1.000 (quadrature + L-BFGS, tests/optimizers/test_gpf_nuts.py); the
  earlier defaults (precision step 1e-3 from 1e3) left the sds at 0.15-0.31 of NUTS'.
- GaussianParticleFlow() (N = 512): worst mean error 0.011 after 3,000 steps (sd ratios 0.999-1.022); the
  error floor is set by N, not by the step (docs/gpf_finite_n.md: N = 100 stays at 0.06).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402
from targets import breast_cancer_nuts  # noqa: E402


@pytest.fixture(scope="module")
def reference():
    return breast_cancer_nuts()


def fit_breast_cancer(optimizer, num_particles, checkpoints, seed=0):
    """Fit the full-batch model for max(checkpoints) steps; {step: (mean, sd)} of the particles (or of q for
    an optimizer with a posterior) after each checkpoint step."""
    (x, y), _ = bk.datasets.load_breast_cancer(test_fraction=0.0, add_bias=True)
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((31,))
    layer = bk.layers.Dense(1, num_particles=num_particles, use_bias=False, kernel_prior=1.0)
    model = bk.BayesianModel(inputs, layer(inputs), likelihood="bernoulli")
    model.compile(optimizer=optimizer)
    moments = {}

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 in checkpoints:
                if isinstance(optimizer, bk.optimizers.MGVBP):
                    q = optimizer.posterior()
                    moments[batch + 1] = q.mean().numpy(), np.sqrt(np.diag(q.covariance().numpy()))
                else:
                    w = layer.kernel.numpy().reshape(num_particles, 31)
                    moments[batch + 1] = w.mean(0), w.std(0, ddof=1)

    data = tf.data.Dataset.from_tensors((x, y.astype(np.float32))).repeat(max(checkpoints))
    model.fit(data, dataset_size=len(x), verbose=0, callbacks=[Record()])
    return moments


def worst_errors(moments, ref):
    mean, sd = moments
    return float(np.max(np.abs(mean - ref["mean"]) / ref["sd"])), sd / ref["sd"]


def test_matrix_svgd_default_is_ahead_of_svgd(reference):
    matrix = fit_breast_cancer(bk.optimizers.MatrixSVGD(), 100, (100, 300))
    vanilla = fit_breast_cancer(bk.optimizers.SVGD(), 100, (100, 300))
    m100, v100 = worst_errors(matrix[100], reference)[0], worst_errors(vanilla[100], reference)[0]
    m300, v300 = worst_errors(matrix[300], reference)[0], worst_errors(vanilla[300], reference)[0]
    assert m100 < 0.7 * v100, (m100, v100)  # measured 0.68 vs 1.22
    assert m300 < v300 + 0.03, (
        m300,
        v300,
    )  # measured 0.32 vs 0.32: both at the finite-N fixed point


@pytest.mark.slow  # 21 s; the default suite's tests/optimizers/test_gpf_nuts.py checks GPF against the same NUTS run
def test_gaussian_particle_flow_default_reaches_the_gaussian_optimum(reference):
    mean_error, sd_ratio = worst_errors(
        fit_breast_cancer(bk.optimizers.GaussianParticleFlow(), 512, (3000,))[3000], reference
    )
    assert mean_error < 0.03, mean_error  # measured 0.011
    assert np.all(np.abs(sd_ratio - 1.0) < 0.05), sd_ratio  # measured 0.999-1.022


def test_mgvbp_full_default_reaches_the_gaussian_optimum(reference):
    moments = fit_breast_cancer(bk.optimizers.MGVBP(structure="full"), 100, (3000,))[3000]
    mean_error, sd_ratio = worst_errors(moments, reference)
    assert mean_error < 0.05, mean_error  # measured 0.024
    assert np.all(np.abs(sd_ratio - 1.0) < 0.05), (
        sd_ratio
    )  # measured 0.960-1.000 (the Gaussian optimum: 0.959-1.000)
