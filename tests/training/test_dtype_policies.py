"""Keras dtype policies: every optimizer trains under mixed_float16, mixed_bfloat16 and float64."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from optimizer_registry import configured
from targets import exact_linear_posterior, linear_data, linear_model, linear_particles, paper_mgvbp

KFAC = bk.preconditioners.KFACPreconditioner
OPTIMIZERS = configured(
    GaussianParticleFlow={"learning_rate": 1e-2, "structure": "layer"},
    IndependentParticles={"learning_rate": 3e-3},
    SVGD={"learning_rate": 1e-2},
    MatrixSVGD=lambda: bk.optimizers.MatrixSVGD(1e-2, preconditioner=KFAC()),
    PreconditionedParticles=lambda: bk.optimizers.PreconditionedParticles(
        1e-2, preconditioner=KFAC()
    ),
    MGVBP=lambda: paper_mgvbp(  # diagonal, empirical Fisher
        2e-3, structure="diagonal", curvature="empirical_fisher", mean_learning_rate=3e-2, seed=0
    ),
    MeanFieldVI={"learning_rate": 1e-2, "seed": 0},
)
OPTIMIZERS["MGVBP kronecker, true Fisher"] = lambda: paper_mgvbp(
    2e-3, structure="kronecker", curvature="fisher", mean_learning_rate=3e-2, seed=0
)


@pytest.fixture
def policy(request):
    name = request.param
    _set_policy(name)
    yield name
    _set_policy("float32")


def _set_policy(name):
    """A global policy as users set it: floatx for float64 / float32, set_global_policy for mixed."""
    keras.config.set_floatx("float64" if name == "float64" else "float32")
    keras.mixed_precision.set_global_policy(name)


def _digits(n=128):
    (x, y), _ = bk.datasets.load_digits()
    return x[:n], y[:n]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16", "float64"], indirect=True)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_optimizer_trains_a_conv_net_under_the_policy(policy, name):
    x, y = _digits()
    model = bk.zoo.lenet5((8, 8, 1), 10, num_particles=4)
    model.compile(optimizer=OPTIMIZERS[name]())
    history = model.fit(x, y, batch_size=32, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses
    # Keras semantics of the policy: variables (and so particles and posterior state) in the variable
    # dtype, layer computations in the compute dtype.
    variable_dtype = "float64" if policy == "float64" else "float32"
    compute_dtype = {
        "mixed_float16": "float16",
        "mixed_bfloat16": "bfloat16",
        "float64": "float64",
    }[policy]
    assert all(v.dtype == variable_dtype for v in model.particle_variables)
    assert model(x[:2]).dtype == compute_dtype
    assert (
        model.predict(x[:2], verbose=0).dtype == variable_dtype
    )  # predictive summaries in float32 / 64
    assert all(
        v.dtype in (variable_dtype, "float64", "int64")
        for v in model.optimizer.variables
        if v.dtype.startswith("float") or v.dtype == "int64"
    )
    if policy == "mixed_float16":  # the model scales float16 backward passes itself
        assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def _gpf_conjugate_errors(dtype):
    """GPF with D + 1 particles through fit on conjugate regression: its fixed point is the exact
    posterior (Theorem 1), so what is left after convergence is rounding error."""
    _set_policy(dtype)
    try:
        noise = 0.5
        x, y = linear_data(noise=noise)
        mean, cov = exact_linear_posterior(x, y, noise)
        model = linear_model(3, 5, bk.likelihoods.Normal(scale=noise))
        # eta * lambda_max(posterior precision ~ 240) ~ 1 < 2; 8000 steps converge to rounding level.
        model.compile(optimizer=bk.optimizers.GaussianParticleFlow(4e-3, step_rule="sgd"))
        data = tf.data.Dataset.from_tensors((x.astype(dtype), y.astype(dtype))).repeat(8000)
        model.fit(data, dataset_size=len(x), verbose=0)
        p = linear_particles(model).astype(np.float64)
    finally:
        _set_policy("float32")
    z = p - p.mean(0)
    sd = np.sqrt(np.diag(cov))
    return (
        np.max(np.abs(p.mean(0) - mean) / sd),
        np.max(np.abs(z.T @ z / len(p) - cov)) / sd.max() ** 2,
    )


def test_float64_recovers_a_conjugate_posterior_beyond_float32_precision():
    mean64, cov64 = _gpf_conjugate_errors("float64")
    mean32, cov32 = _gpf_conjugate_errors("float32")
    # float32 rounding (eps 1.2e-7, amplified by sums over the data) leaves its covariance error near
    # 1e-5 (measured); float64 reaches 1e-13.
    assert mean64 < 1e-10 and cov64 < 1e-10, (mean64, cov64)
    assert cov32 > 1e-8 and mean64 < mean32, (mean32, cov32)
