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
    with pytest.raises(ValueError, match=r"labels must be in \[0, 2\)"):
        bk.metrics.nll(np.full((2, 2), 0.5), [0, 2])
    with pytest.raises(ValueError, match="Expected probs"):
        bk.metrics.ece(np.full((3, 2), 0.5), [0, 1])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda p, y: bk.metrics.nll(-p, y), r"probabilities in \[0, 1\]"),
        (lambda p, y: bk.metrics.nll(5 * p, y), r"probabilities in \[0, 1\]"),
        (lambda p, y: bk.metrics.nll(0.5 * p, y), "sum to 1"),
        (lambda p, y: bk.metrics.nll(p[:0], y[:0]), "No examples"),
        (lambda p, y: bk.metrics.ece(p[:0], y[:0]), "No examples"),
        (lambda p, y: bk.metrics.accuracy(p[:0], y[:0]), "No examples"),
        (lambda p, y: bk.metrics.brier(np.log(p), y), r"probabilities in \[0, 1\]"),
        (lambda p, y: bk.metrics.rmse(np.zeros(0), np.zeros(0)), "No examples"),
        (lambda p, y: bk.metrics.rmse(np.array([np.nan]), np.zeros(1)), "NaN"),
        (
            lambda p, y: bk.pfbr.mmd_squared(np.zeros((0, 2)), np.zeros((5, 2))),
            "at least 2 samples",
        ),
        (lambda p, y: bk.pfbr.mmd_squared(np.zeros((4, 2)), np.zeros((5, 3))), r"\(N, d\)"),
    ],
)
def test_impossible_metric_inputs_are_refused(call, match):
    """nll(-p) was 690.8, nll(5 p) -0.51, and empty inputs NaN with numpy warnings."""
    p = np.array([[0.7, 0.3], [0.2, 0.8], [0.5, 0.5]])
    y = np.array([0, 1, 1])
    with pytest.raises(ValueError, match=match):
        call(p, y)


def test_ece_equals_tensorflow_probability():
    import tensorflow_probability as tfp

    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((1000, 6)) * 3).astype(np.float32)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    labels = rng.integers(0, 6, 1000)
    for bins in (1, 7, 15):
        reference = float(
            tfp.stats.expected_calibration_error(bins, logits=logits, labels_true=labels)
        )
        assert bk.metrics.ece(probs, labels, bins) == pytest.approx(reference, abs=1e-6)


def test_binary_probabilities_equal_two_class_form():
    rng = np.random.default_rng(1)
    p1 = rng.uniform(size=300)
    labels = (rng.uniform(size=300) < p1).astype(int)
    two = np.stack([1 - p1, p1], 1)
    for fn in (bk.metrics.accuracy, bk.metrics.nll, bk.metrics.brier, bk.metrics.ece):
        assert fn(p1, labels) == pytest.approx(fn(two, labels), abs=1e-12)
        assert fn(p1[:, None], labels[:, None]) == pytest.approx(fn(two, labels), abs=1e-12)
    ece = bk.metrics.ExpectedCalibrationError(num_bins=10)
    ece.update_state(labels.astype(np.float32), p1.astype(np.float32))
    assert float(ece.result()) == pytest.approx(bk.metrics.ece(two, labels, 10), abs=1e-5)
    brier = bk.metrics.BrierScore()
    brier.update_state(labels[:, None].astype(np.float32), p1[:, None].astype(np.float32))
    assert float(brier.result()) == pytest.approx(np.mean(2 * (p1 - labels) ** 2), abs=1e-5)


def test_functions_against_scikit_learn():
    from sklearn import metrics as skm

    rng = np.random.default_rng(2)
    logits = rng.standard_normal((400, 5)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = rng.integers(0, 5, 400)
    assert bk.metrics.accuracy(probs, labels) == pytest.approx(
        skm.accuracy_score(labels, probs.argmax(1))
    )
    assert bk.metrics.nll(probs, labels) == pytest.approx(
        skm.log_loss(labels, probs, labels=range(5)), rel=1e-9
    )
    p1 = probs[:, 0]
    y1 = (labels == 0).astype(int)
    assert bk.metrics.brier(p1, y1) == pytest.approx(2 * skm.brier_score_loss(y1, p1), rel=1e-9)
    mean, target = rng.standard_normal(50), rng.standard_normal(50)
    assert bk.metrics.rmse(mean, target) == pytest.approx(
        np.sqrt(skm.mean_squared_error(target, mean))
    )
    neg = np.round(rng.standard_normal(200), 1)  # ties included
    pos = np.round(rng.standard_normal(150) + 0.7, 1)
    expected = skm.roc_auc_score(np.r_[np.zeros(200), np.ones(150)], np.r_[neg, pos])
    assert bk.metrics.auroc(neg, pos) == pytest.approx(expected, abs=1e-12)


def test_ece_by_hand_with_weights_in_keras_metric():
    probs = np.array([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]], np.float32)
    labels = np.array([0, 1, 1, 1])
    m = bk.metrics.ExpectedCalibrationError(num_bins=2)
    # weight 3 on the wrong example: one bin, accuracy 3/6, confidence (0.9 + 1.8 + 0.7 + 0.8) / 6
    m.update_state(labels, probs, sample_weight=np.array([1.0, 3.0, 1.0, 1.0]))
    assert float(m.result()) == pytest.approx(abs(3 / 6 - 4.2 / 6), abs=1e-6)


def test_interval_functions_and_log_likelihood():
    import tensorflow_probability as tfp

    y = np.array([0.0, 1.0, 2.0, 3.0])
    assert bk.metrics.interval_coverage(y - 0.5, y + 0.5, y + [0.0, 0.6, -0.5, 2.0]) == 0.5
    assert bk.metrics.interval_width(y - 0.5, y + 1.0) == 1.5
    dist = tfp.distributions.Normal(np.zeros(4), np.ones(4))
    expected = np.mean(-0.5 * y**2 - 0.5 * np.log(2 * np.pi))
    assert bk.metrics.log_likelihood(dist, y) == pytest.approx(expected)
    with pytest.raises(ValueError, match="upper bounds are below"):
        bk.metrics.interval_coverage(y + 1, y, y)
    with pytest.raises(ValueError, match="same shape"):
        bk.metrics.interval_width(y, y[:3])
    with pytest.raises(ValueError, match="both groups"):
        bk.metrics.auroc([], [1.0])
    with pytest.raises(ValueError, match="num_bins"):
        bk.metrics.ExpectedCalibrationError(num_bins=0)


def test_particle_mixture_quantiles_are_exact():
    """Quantiles of an equal mixture of Gaussians against a root finder on its CDF (scipy)."""
    import scipy.optimize
    import scipy.stats

    rng = np.random.default_rng(3)
    loc = rng.standard_normal((6, 5, 2)) * [1.0, 30.0]  # (batch, N particles, d outputs)
    scale = np.array([0.3, 4.0])
    dist = bk.likelihoods.ParticleMixture(
        tfp_categorical(np.zeros((6, 5))), tfp_independent_normal(loc, scale)
    )
    for p in (0.025, 0.5, 0.975):
        q = dist.quantile(p).numpy()
        assert q.shape == (6, 2)
        for b in range(6):
            for j in range(2):
                f = lambda t: np.mean(scipy.stats.norm.cdf(t, loc[b, :, j], scale[j])) - p  # noqa: E731
                exact = scipy.optimize.brentq(f, -500, 500, xtol=1e-12)
                assert q[b, j] == pytest.approx(exact, abs=1e-9 * max(1.0, abs(exact)))


def tfp_independent_normal(loc, scale):
    import tensorflow_probability as tfp

    tfd = tfp.distributions
    return tfd.Independent(
        tfd.Normal(loc, np.broadcast_to(scale, loc.shape)), reinterpreted_batch_ndims=1
    )


def tfp_categorical(logits):
    import tensorflow_probability as tfp

    return tfp.distributions.Categorical(logits=logits)
