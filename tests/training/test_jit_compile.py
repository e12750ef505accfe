"""jit_compile=True: XLA gives the same training trajectory as the graph path, for every optimizer."""

import warnings

import keras
import numpy as np
import pytest

import bayes_keras as bk
from optimizer_registry import configured
from targets import paper_mgvbp

KFAC = bk.preconditioners.KFACPreconditioner
OPTIMIZERS = configured(
    GaussianParticleFlow={"learning_rate": 1e-2},
    IndependentParticles={"learning_rate": 3e-3},
    SVGD={"learning_rate": 1e-2},
    MatrixSVGD=lambda: bk.optimizers.MatrixSVGD(1e-2, preconditioner=KFAC()),
    PreconditionedParticles=lambda: bk.optimizers.PreconditionedParticles(
        1e-2, preconditioner=KFAC()
    ),
    MGVBP=lambda: paper_mgvbp(1e-3, structure="diagonal", curvature="empirical_fisher", seed=0),
    MeanFieldVI={"learning_rate": 1e-2, "seed": 0},
)


def _digits(n=96):
    (x, y), _ = bk.datasets.load_digits()
    return x[:n].reshape(n, -1), y[:n]


# Gaussian-VI optimizers draw their samples from stateless Philox keyed by (seed, counter); XLA's
# Philox gives other numbers for the same key than TensorFlow's kernel, so their XLA runs are
# compared with a second XLA run (same stream) instead of the graph path.
SAMPLING = {"MGVBP", "MeanFieldVI"}


def _train(name, jit):
    x, y = _digits()
    keras.utils.set_random_seed(7)
    model = bk.zoo.mlp(64, 10, (16,), num_particles=4, likelihood="categorical")
    model.compile(optimizer=OPTIMIZERS[name](), jit_compile=jit)
    assert model.jit_compile is jit
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    return [v.numpy() for v in model.particle_variables]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_xla_trains_like_the_graph_path(name):
    reference = _train(name, jit=name in SAMPLING)
    xla = _train(name, jit=True)
    # Same data, seeds and streams: the two compilers differ only by rounding (6 steps).
    for a, b in zip(reference, xla):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)


def test_grouped_particle_convolutions_proceed_without_xla_on_cpu():
    x, y = _digits()
    model = bk.zoo.lenet5((8, 8, 1), 10, num_particles=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.compile(optimizer=bk.optimizers.IndependentParticles(1e-3), jit_compile=True)
    assert model.jit_compile is False
    assert any("conv2" in str(w.message) and "XLA" in str(w.message) for w in caught)
    history = model.fit(x.reshape(-1, 8, 8, 1), y, batch_size=32, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
