"""`.keras` save/load: nothing lost, and training resumes exactly."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import config as tf_framework_config

import bayes_keras as bk
from targets import keras_round_trip, paper_mgvbp


@pytest.fixture
def digits():
    (xtr, ytr), (xte, _) = bk.datasets.load_digits()
    return xtr[:192], ytr[:192], xte[:64]


@pytest.fixture
def op_determinism():
    """Deterministic kernels for one test: the switch is process-wide, and while it is on Keras compiles every
    later model with jit_compile=False (tests/training/test_jit_compile.py failed when it ran after this file in the
    same pytest-xdist worker). TensorFlow has no public switch back."""
    tf.config.experimental.enable_op_determinism()
    yield
    tf_framework_config.disable_op_determinism()


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: bk.optimizers.GaussianParticleFlow(1e-2, structure="layer", step_rule="adam"),
        lambda: bk.optimizers.IndependentParticles(1e-3),
        lambda: paper_mgvbp(1e-3, structure="diagonal", seed=3),
        lambda: paper_mgvbp(1e-3, structure="kronecker", curvature="empirical_fisher", seed=3),
        lambda: bk.optimizers.MeanFieldVI(1e-3, seed=4),
        lambda: bk.optimizers.MatrixSVGD(
            0.5, bk.preconditioners.KFACPreconditioner(inversion_period=2)
        ),
        lambda: bk.optimizers.PreconditionedParticles(
            0.1, bk.preconditioners.KFACPreconditioner(inversion_period=2)
        ),
        # true Fisher: labels sampled from the model, keyed by (the model's label seed, the optimizer's step)
        lambda: paper_mgvbp(1e-3, structure="diagonal", curvature="fisher", seed=3),
        lambda: bk.optimizers.MatrixSVGD(
            0.1, bk.preconditioners.KFACPreconditioner(inversion_period=2, fisher="true")
        ),
    ],
)
def test_roundtrip_and_exact_resume(tmp_path, digits, optimizer, op_determinism):
    xtr, ytr, xte = digits
    model = bk.zoo.lenet5(num_particles=3)
    model.compile(optimizer=optimizer(), metrics=["accuracy"])
    model.fit(xtr, ytr, batch_size=64, epochs=1, verbose=0, shuffle=False)
    loaded = keras_round_trip(model, tmp_path, "m")
    assert isinstance(loaded, bk.BayesianModel)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert loaded.dataset_size == model.dataset_size and loaded.num_particles == 3
    np.testing.assert_array_equal(loaded.predict(xte, verbose=0), model.predict(xte, verbose=0))
    model.fit(xtr, ytr, batch_size=64, epochs=2, verbose=0, shuffle=False)
    loaded.fit(xtr, ytr, batch_size=64, epochs=2, verbose=0, shuffle=False)
    assert int(loaded.optimizer.iterations) == int(model.optimizer.iterations) == 9
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(
        model.optimizer.variables, loaded.optimizer.variables
    ):  # e.g. q's mean and precision
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_learned_noise_and_temperature_survive_saving(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    y = x.sum(1, keepdims=True).astype(np.float32)
    model = bk.zoo.mlp(
        3,
        1,
        (8,),
        num_particles=3,
        likelihood=bk.likelihoods.Normal(scale="learned"),
        temperature=0.5,
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=2, verbose=0)
    loaded = keras_round_trip(model, tmp_path, "r")
    assert loaded.temperature == 0.5
    np.testing.assert_array_equal(
        loaded.likelihood.noise_scale().numpy(), model.likelihood.noise_scale().numpy()
    )
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0)["std"], model.predict(x, verbose=0)["std"]
    )


def test_load_model_checks_the_file_before_keras_reads_it(tmp_path, monkeypatch):
    inputs = keras.Input((4,))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(3, num_particles=2)(inputs), likelihood="categorical"
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    path = str(tmp_path / "m.keras")
    model.save(path)
    np.testing.assert_array_equal(
        bk.load_model(path).predict_particles(x), model.predict_particles(x)
    )
    data = open(path, "rb").read()
    truncated = tmp_path / "t.keras"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"t.keras' is a truncated .keras file"):
        bk.load_model(str(truncated))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bk.load_model(str(tmp_path / "missing.keras"))
    monkeypatch.setattr(bk.loading, "MAX_CONFIG_BYTES", 100)  # the config.json bound (64 MiB)
    with pytest.raises(
        ValueError, match=r"has a config.json of [\d,]+ bytes unpacked, above the 100"
    ):
        bk.load_model(path)
