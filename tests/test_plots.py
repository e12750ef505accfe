"""Plots return figures built from the same numbers as the metrics."""

import numpy as np
import pytest

import bayes_keras as bk


def test_reliability_diagram_bars_are_bin_accuracies(tmp_path):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((300, 4)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = rng.integers(0, 4, 300)
    fig = bk.plots.reliability_diagram(probs, labels, num_bins=10)
    top = fig.axes[0]
    _, acc, count = bk.metrics.calibration_curve(probs, labels, 10)
    heights = [p.get_height() for p in top.patches[: int((count > 0).sum())]]
    np.testing.assert_allclose(heights, acc[count > 0])
    legend = " ".join(t.get_text() for t in top.get_legend().get_texts())
    assert f"ECE {bk.metrics.ece(probs, labels, 10):.4f}" in legend
    fig.savefig(tmp_path / "reliability.png")
    assert (tmp_path / "reliability.png").stat().st_size > 1000


def fig_curve(fig):
    line = fig.axes[0].lines[0]
    return np.asarray(line.get_xdata()), np.asarray(line.get_ydata())


def test_other_plots_render(tmp_path):
    rng = np.random.default_rng(1)
    mean = rng.standard_normal(50)
    targets = mean + rng.standard_normal(50)
    fig = bk.plots.regression_intervals(mean, mean - 2, mean + 2, targets)
    legend = " ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    inside = np.mean(np.abs(targets - mean) <= 2)
    assert f"targets ({inside:.0%} inside)" in legend
    fig.savefig(tmp_path / "intervals.png")
    errors = (rng.uniform(size=50) < 0.2).astype(float)
    fig = bk.plots.uncertainty_vs_error(rng.uniform(size=50), errors)
    assert fig.axes[0].lines[0].get_ydata()[-1] == pytest.approx(errors.mean())  # nothing set aside
    # an uncertainty that knows the errors: after setting aside the mistakes, the rest is error-free
    fraction, error = fig_curve(
        bk.plots.uncertainty_vs_error(errors + 0.01 * rng.uniform(size=50), errors)
    )
    assert np.all(error[fraction >= errors.mean() - 1e-9] == 0.0)
    fig = bk.plots.particles_2d(rng.standard_normal((20, 2)), lambda z: -0.5 * np.sum(z**2, 1))
    fig.savefig(tmp_path / "particles.png")
    with pytest.raises(ValueError, match=r"\(N, 2\)"):
        bk.plots.particles_2d(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="same length"):
        bk.plots.uncertainty_vs_error(np.zeros(3), np.zeros(4))
