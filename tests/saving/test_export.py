"""The exported SavedModel serves the predictive in a process where bayes_keras cannot be imported."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import bayes_keras as bk

_SERVE = r"""
import json, sys
sys.modules["bayes_keras"] = None  # importing bayes_keras now fails
try:
    import bayes_keras  # noqa: F401
    raise SystemExit("bayes_keras was importable")
except ImportError:
    pass
import numpy as np, tensorflow as tf
path, inputs_file, out_file = sys.argv[1:4]
served = tf.saved_model.load(path)
x = np.load(inputs_file)["x"]
results = {}
for name, value in served.signatures["serving_default"](inputs=tf.constant(x)).items():
    results["serving_default/" + name] = value.numpy()
for endpoint in ("predictive", "uncertainty"):
    for name, value in getattr(served, endpoint)(x).items():
        results[endpoint + "/" + name] = value.numpy()
results["particle_outputs"] = served.particle_outputs(x).numpy()
if hasattr(served, "quantiles"):
    results["quantiles"] = served.quantiles(x, np.array([0.025, 0.5, 0.975], np.float32)).numpy()
np.savez(out_file, **results)
"""


def _serve_elsewhere(path, x, tmp_path):
    np.savez(tmp_path / "inputs.npz", x=x)
    script = tmp_path / "serve.py"
    script.write_text(_SERVE)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            str(path),
            str(tmp_path / "inputs.npz"),
            str(tmp_path / "served.npz"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(np.load(tmp_path / "served.npz"))


def _check(model, x, tmp_path):
    path = model.export(tmp_path / "exported", verbose=False)
    served = _serve_elsewhere(path, x, tmp_path)
    summary = model.predict(x, verbose=0)
    summary = summary if isinstance(summary, dict) else {"probabilities": summary}
    uncertainty = model.uncertainty(x)
    for name, value in summary.items():
        np.testing.assert_allclose(served["predictive/" + name], value, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(served["serving_default/" + name], value, rtol=1e-5, atol=1e-6)
    for name, value in uncertainty.items():
        np.testing.assert_allclose(served["uncertainty/" + name], value, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(served["serving_default/" + name], value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        served["particle_outputs"], model.predict_particles(x), rtol=1e-5, atol=1e-6
    )
    return served


@pytest.mark.subprocess
def test_export_classifier_lenet(tmp_path):
    (x, y), _ = bk.datasets.load_digits()
    keras.utils.set_random_seed(0)
    model = bk.zoo.lenet5(num_particles=3, input_shape=(8, 8, 1), num_classes=10)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(3e-3, structure="layer"))
    model.fit(x[:128], y[:128], epochs=1, batch_size=64, verbose=0)
    _check(model, x[:20], tmp_path)


@pytest.mark.subprocess
def test_export_bernoulli(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    model = bk.zoo.mlp(3, 1, (8,), num_particles=4, likelihood="bernoulli")
    model.compile(optimizer=bk.optimizers.SVGD(1e-2))
    model.fit(x, y, epochs=2, verbose=0)
    served = _check(model, x, tmp_path)
    assert served["predictive/probabilities"].shape == (40,)


@pytest.mark.subprocess
def test_export_regression_quantiles(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 2)).astype(np.float32)
    y = (100.0 + 30.0 * x[:, 0] + 5.0 * rng.standard_normal(50)).astype(np.float32)
    model = bk.zoo.mlp(2, 1, (8,), num_particles=5, likelihood="normal")
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=3, verbose=0)
    served = _check(model, x, tmp_path)
    dist = model.predictive(x)
    expected = np.stack([dist.quantile(p).numpy() for p in (0.025, 0.5, 0.975)], axis=1)
    np.testing.assert_allclose(served["quantiles"], expected, rtol=1e-5, atol=1e-4)
    assert np.all(np.diff(served["quantiles"], axis=1) > 0)


def test_export_message_names_the_target(tmp_path, capsys):
    """The export is written to a temporary directory and swapped in: the message names where it ended up."""
    model = bk.zoo.mlp(2, 1, (4,), num_particles=2, likelihood="normal")
    model(np.zeros((1, 2), np.float32))
    target = tmp_path / "predictive"
    model.export(target)
    out = capsys.readouterr().out
    assert f"'{target}'" in out and "quantiles" in out, out
    assert "tmp" not in out.replace(str(tmp_path), ""), out


def test_legacy_h5_refused(tmp_path):
    model = bk.zoo.mlp(3, 2, (4,), num_particles=2, likelihood="categorical")
    with pytest.raises(ValueError, match=r"\.keras"):
        model.save(tmp_path / "model.h5")
