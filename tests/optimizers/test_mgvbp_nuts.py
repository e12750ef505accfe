"""Ground truth: MGVBP (full precision) against the long NUTS run on Bayesian logistic regression, and
against GPF, which optimises the same objective.

Model and reference as in test_gpf_nuts.py: breast_cancer, standardised + bias (D = 31), Bernoulli
likelihood, prior N(0, I); NUTS mean / marginal sds from tests/fixtures/breast_cancer_nuts.npz.
MGVBP runs through model.fit: a BayesianModel with one Dense(1, use_bias=False) particle layer whose
S particles are the step's samples from q, full batch, schedule beta = 0.1 for 300 steps then
beta * 300 / t, 4,000 steps, seed 0.

Measured (this configuration, with the full block's signal-share step): gradient estimator, S = 100: worst mean error 0.030 NUTS sd, sd ratios
0.962 - 1.001 (the exact optimal Gaussian, computed by quadrature + L-BFGS, is at 0.025 / 0.959 - 1.000,
test_gpf_nuts.py docstring); the paper's score estimator, S = 200, 6,000 steps, beta 0.05: 0.031 /
0.947 - 1.014 (slow test). Against GPF (N = 256, the run of test_gpf_nuts.py): means within 0.08 NUTS
sd, MGVBP sd / GPF sd 0.90 - 1.00 (GPF's finite-N sds are inflated by up to 7 %, docs/gpf_finite_n.md),
and on the shared objective MGVBP's Gaussian is the better one: ELBO -26.98 vs -27.21 (40,000 common
random draws; the constant-free log joint of test_gpf_nuts.py).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402
from targets import (
    NUTS_MEAN_TOL,
    NUTS_SD_TOL,
    breast_cancer_log_prob,
    breast_cancer_nuts,
    paper_mgvbp,
    run_gpf_breast_cancer,
)  # noqa: E402


def _run_mgvbp(estimator="gradient", samples=100, lr=0.1, tau=300, steps=4000):
    (x, y), _ = bk.datasets.load_breast_cancer(test_fraction=0.0, add_bias=True)
    inputs = keras.Input((31,))
    logits = bk.layers.Dense(1, num_particles=samples, use_bias=False, kernel_prior=1.0)(inputs)
    model = bk.BayesianModel(inputs, logits, likelihood="bernoulli")
    optimizer = paper_mgvbp(
        bk.schedules.ConstantThenInverseTime(lr, tau), structure="full", estimator=estimator, seed=0
    )
    model.compile(optimizer=optimizer)
    data = tf.data.Dataset.from_tensors((x, y.astype(np.float32))).repeat(steps)
    model.fit(data, dataset_size=len(x), verbose=0)
    q = optimizer.posterior()
    return q.mean().numpy(), q.covariance().numpy()


def _check_against_nuts(mean, cov, ref):
    sd = np.sqrt(np.diag(cov))
    mean_err = np.abs(mean - ref["mean"]) / ref["sd"]
    sd_ratio = sd / ref["sd"]
    assert np.all(mean_err < NUTS_MEAN_TOL), f"worst mean error {mean_err.max():.3f} NUTS sd"
    assert np.all(np.abs(sd_ratio - 1.0) < NUTS_SD_TOL), (
        f"sd ratios {sd_ratio.min():.3f}..{sd_ratio.max():.3f}"
    )


@pytest.fixture(scope="module")
def reference():
    return breast_cancer_nuts()


@pytest.fixture(scope="module")
def mgvbp_gaussian():
    return _run_mgvbp()


def test_mgvbp_full_matches_nuts_posterior(mgvbp_gaussian, reference):
    _check_against_nuts(*mgvbp_gaussian, reference)


def test_mgvbp_and_gpf_reach_the_same_gaussian_optimum(mgvbp_gaussian, reference):
    mean, cov = mgvbp_gaussian
    gpf = run_gpf_breast_cancer(8000)
    sd, sd_gpf = np.sqrt(np.diag(cov)), np.sqrt(np.diag(gpf.covariance))
    assert np.max(np.abs(mean - gpf.mean) / reference["sd"]) < 0.1
    assert np.all(np.abs(sd / sd_gpf - 1.0) < 0.12)  # GPF's N = 256 sds run up to 7 % wide
    # The shared objective, with common random numbers: ELBO(q) = E_q[log p(y, w)] + H(q).
    log_prob = breast_cancer_log_prob()
    eps = np.random.default_rng(0).standard_normal((40_000, 31))

    def elbo(m, c):
        w = (m + eps @ np.linalg.cholesky(c).T).astype(np.float32)
        values = log_prob(tf.constant(w)).numpy().astype(np.float64)
        return values.mean() + 0.5 * np.linalg.slogdet(2 * np.pi * np.e * c)[1]

    elbo_mgvbp, elbo_gpf = elbo(mean, cov), elbo(gpf.mean, gpf.covariance)
    assert abs(elbo_mgvbp - elbo_gpf) < 0.5
    assert (
        elbo_mgvbp > elbo_gpf - 0.05
    )  # no worse than GPF's finite-N Gaussian (measured: 0.22 better)


@pytest.mark.slow
def test_mgvbp_score_estimator_matches_nuts_posterior(reference):
    """The paper's default estimator (log likelihood score + closed-form prior, control variates)."""
    _check_against_nuts(*_run_mgvbp("score", samples=200, lr=0.05, steps=6000), reference)
