"""Files saved by an earlier version load and predict the same: one small trained model per optimizer, saved
with the code of 2026-11-26 (tests/fixtures/make_saved_models.py), before the method packages moved."""

import os

import keras
import numpy as np
import pytest

import bayes_keras as bk  # noqa: F401  (registers the serializable classes)
from paths import FIXTURES

HERE = os.path.join(FIXTURES, "saved_models")
NAMES = sorted(f[: -len(".keras")] for f in os.listdir(HERE) if f.endswith(".keras"))


def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 4)).astype("float32")
    return x, (x[:, 0] + x[:, 1] > 0).astype("int64")


def test_every_optimizer_has_a_saved_model():
    assert len(NAMES) == 9


@pytest.mark.parametrize("name", NAMES)
def test_a_saved_model_loads_predicts_and_trains_on(name):
    x, y = _data()
    model = keras.models.load_model(os.path.join(HERE, name + ".keras"))
    np.testing.assert_allclose(
        model.predict_particles(x), np.load(os.path.join(HERE, name + ".npy")), rtol=1e-6, atol=1e-6
    )
    assert (
        int(model.optimizer.iterations.numpy()) == 4
    )  # 2 epochs of 2 batches: the state came back
    history = model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    assert model.optimizer.skipped_updates == 0
    assert int(model.optimizer.iterations.numpy()) == 6
