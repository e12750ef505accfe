"""Calibration metrics against hand-computed values."""

import numpy as np
import pytest

import bayes_keras as bk


def test_metrics_by_hand():
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]])
    labels = np.array([0, 1, 1, 1])
    assert bk.metrics.accuracy(probs, labels) == 0.75
    assert abs(bk.metrics.nll(probs, labels) - (-np.mean(np.log([0.9, 0.4, 0.7, 0.8])))) < 1e-9
    assert abs(bk.metrics.brier(probs, labels) - np.mean([0.02, 0.72, 0.18, 0.08])) < 1e-9
    # 2 bins: [0, .5], (.5, 1]: all confidences > .5 -> one bin: |acc 0.75 - conf 0.75| = 0
    assert abs(bk.metrics.ece(probs, labels, num_bins=2)) < 1e-12
    # 10 bins: bins .9 {0.9: correct}, .6 {0.6: wrong}, .7 {0.7 correct}, .8 {0.8 correct}
    expected = (abs(1 - 0.9) + abs(0 - 0.6) + abs(1 - 0.7) + abs(1 - 0.8)) / 4
    assert abs(bk.metrics.ece(probs, labels, num_bins=10) - expected) < 1e-12


def test_keras_metrics_match_functions():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((500, 4)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = rng.integers(0, 4, 500)
    m = bk.metrics.ExpectedCalibrationError(num_bins=15)
    m.update_state(labels[:200], probs[:200].astype(np.float32))
    m.update_state(labels[200:], probs[200:].astype(np.float32))
    assert abs(float(m.result()) - bk.metrics.ece(probs, labels, 15)) < 1e-5
    b = bk.metrics.BrierScore()
    b.update_state(labels, probs.astype(np.float32))
    assert abs(float(b.result()) - bk.metrics.brier(probs, labels)) < 1e-5


def test_metric_input_errors():
    with pytest.raises(ValueError, match=r"Labels must be in \[0, 2\)"):
        bk.metrics.nll(np.full((2, 2), 0.5), [0, 2])
    with pytest.raises(ValueError, match="Expected probs"):
        bk.metrics.ece(np.full((3, 2), 0.5), [0, 1])
