"""LeNet-5 on digits end to end (the main job's claim), and a fast smoke version."""

import importlib.util
import os

import numpy as np
import pytest

import bayes_keras as bk
from paths import ROOT

_EXAMPLE = os.path.join(ROOT, "examples", "lenet_digits.py")


def _load_example():
    spec = importlib.util.spec_from_file_location("lenet_digits", _EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpf_lenet_learns_digits_fast():
    (xtr, ytr), (xte, yte) = bk.datasets.load_digits()
    model = bk.zoo.lenet5(num_particles=4)
    model.compile(
        optimizer=bk.optimizers.GaussianParticleFlow(3e-3, structure="layer"), metrics=["accuracy"]
    )
    hist = model.fit(xtr, ytr, batch_size=64, epochs=8, verbose=0)
    assert np.all(np.isfinite(hist.history["free_energy"]))
    assert hist.history["free_energy"][-1] < hist.history["free_energy"][0]
    scores = bk.metrics.evaluate_probs(model.predict(xte, verbose=0), yte)
    assert scores["accuracy"] > 0.85, scores


@pytest.mark.slow
def test_gpf_beats_deterministic_lenet_over_three_seeds():
    """Acceptance: mean over 3 seeds, GPF's held-out NLL below the deterministic LeNet's and its
    accuracy at least as high (the README table comes from the same code)."""
    example = _load_example()
    results, _, _ = example.run(seeds=(0, 1, 2), verbose=False)
    det = results["deterministic LeNet (Keras, Adam)"]
    gpf = next(v for k, v in results.items() if k.startswith("GPF"))
    mean = lambda runs, k: float(np.mean([r[k] for r in runs]))  # noqa: E731
    assert mean(gpf, "nll") < mean(det, "nll")
    assert mean(gpf, "accuracy") >= mean(det, "accuracy")
