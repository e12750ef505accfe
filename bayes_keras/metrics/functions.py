"""Scores of a predictive distribution as plain functions on numpy arrays.

Classification functions take predictive probabilities `probs` (e.g. `model.predict(x)`): (n, K) for K
classes, or (n,) / (n, 1) probabilities of class 1 for a binary (Bernoulli) model; and labels (n,) or
(n, 1) integers. The Brier score is TensorFlow Probability's (`tfp.stats.brier_score`), reported on the
usual [0, 2] scale (tfp's omits the constant 1); ECE uses the bins of `tfp.stats.
expected_calibration_error` in float64.

Regression functions take the predictive mean / interval bounds (n,) or (n, d) and targets of the
same shape.
"""

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.training import call_checks

_TINY = 1e-300  # log(0) guard in float64: keeps a zero probability finite without moving any other


def class_probabilities(probs, labels):
    """(probs (n, K) float64, labels (n,) int64) after checking shapes and ranges; binary probabilities of
    class 1, (n,) or (n, 1), become (n, 2)."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels)
    labels = labels.reshape(-1) if labels.ndim == 2 and labels.shape[1] == 1 else labels
    if probs.ndim == 1 or (probs.ndim == 2 and probs.shape[1] == 1):
        p1 = probs.reshape(-1)
        probs = np.stack([1.0 - p1, p1], axis=1)
    if probs.ndim != 2 or labels.ndim != 1 or probs.shape[0] != labels.shape[0]:
        raise ValueError(
            f"Expected probs (n, K) (or (n,) for a binary model) and labels (n,); got "
            f"{np.shape(probs)} and {np.shape(labels)}."
        )
    if not np.issubdtype(labels.dtype, np.number) and not np.issubdtype(labels.dtype, np.bool_):
        raise ValueError(f"labels must be integer class indices; got dtype {labels.dtype}.")
    if labels.size and not np.all(labels == np.round(labels)):
        raise ValueError(
            f"labels must be integers (class indices); got non-integer values (e.g. "
            f"{_first_non_integer(labels)})."
        )
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= probs.shape[1]):
        raise ValueError(
            f"labels must be in [0, {probs.shape[1]}) (probs has {probs.shape[1]} classes); got range "
            f"[{labels.min()}, {labels.max()}]."
        )
    if not np.all(np.isfinite(probs)):
        raise ValueError(f"probs contains {int(np.sum(~np.isfinite(probs)))} NaN or Inf value(s).")
    if probs.shape[0] == 0:
        raise ValueError(
            "No examples: probs and labels have 0 rows (a score of nothing is undefined)."
        )
    if probs.min() < -1e-6 or probs.max() > 1.0 + 1e-6:
        raise ValueError(
            f"probs must be probabilities in [0, 1]; got values in [{probs.min():.4g}, "
            f"{probs.max():.4g}] (logits? apply softmax / sigmoid, or use model.predict)."
        )
    sums = probs.sum(1)
    if np.max(np.abs(sums - 1.0)) > 1e-3:
        raise ValueError(
            f"Each row of probs must sum to 1 (a distribution over the classes); got sums in "
            f"[{sums.min():.4g}, {sums.max():.4g}]."
        )
    return np.clip(probs, 0.0, 1.0), labels


def accuracy(probs, labels):
    """Fraction of examples whose most probable class is the label (binary: p > 0.5 predicts 1)."""
    probs, labels = class_probabilities(probs, labels)
    # ties -> lower class (binary: p = 0.5 -> 0, as Keras)
    return float(np.mean(np.argmax(probs, 1) == labels))


def nll(probs, labels):
    """Mean negative log predictive probability of the true class (nats)."""
    probs, labels = class_probabilities(probs, labels)
    return float(-np.mean(np.log(np.maximum(probs[np.arange(len(labels)), labels], _TINY))))


def brier(probs, labels):
    """Mean over examples of sum_k (p_k - 1[y = k])^2, range [0, 2] (tfp.stats.brier_score + 1)."""
    probs, labels = class_probabilities(probs, labels)
    per_example = tfp.stats.brier_score(labels, np.log(np.maximum(probs, _TINY)))
    return float(np.mean(per_example.numpy() + 1.0))


def calibration_curve(probs, labels, num_bins=15):
    """Per equal-width confidence bin [i / B, (i + 1) / B) (the last closed): (mean confidence, accuracy,
    count), the bins of `ece`. Empty bins give NaN means."""
    probs, labels = class_probabilities(probs, labels)
    _check_bins(num_bins)
    conf = probs.max(1)
    correct = (probs.argmax(1) == labels).astype(np.float64)
    idx = np.minimum((conf * num_bins).astype(np.int64), num_bins - 1)
    count = np.bincount(idx, minlength=num_bins).astype(np.float64)
    conf_sum = np.bincount(idx, weights=conf, minlength=num_bins)
    acc_sum = np.bincount(idx, weights=correct, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return conf_sum / count, acc_sum / count, count


def ece(probs, labels, num_bins=15):
    """Expected calibration error (Guo et al. 2017, Eq. 3; top label, `num_bins` equal-width bins):
    sum_b |acc_b - conf_b| n_b / n. The bins of tfp.stats.expected_calibration_error, computed here in
    float64 (tfp's takes float32 logits only; the two agree to float32 precision, tested)."""
    conf, acc, count = calibration_curve(probs, labels, num_bins)
    mask = count > 0
    return float(np.sum(np.abs(acc[mask] - conf[mask]) * count[mask]) / np.sum(count))


def evaluate_probs(probs, labels, num_bins=15):
    """Dict of accuracy, nll, ece, brier."""
    return {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "ece": ece(probs, labels, num_bins),
        "brier": brier(probs, labels),
    }


def rmse(mean, targets):
    """Root mean squared error of the predictive mean."""
    mean, targets = _same_shape(mean, targets, "mean")
    return float(np.sqrt(np.mean((mean - targets) ** 2)))


def log_likelihood(predictive, targets):
    """Mean log predictive density (test log likelihood) of `targets` under `predictive`, a TFP
    distribution with batch shape (n,) (e.g. `model.predictive(x)`): classification or regression."""
    targets = np.asarray(targets)
    if not isinstance(predictive, tfp.distributions.Distribution):
        raise ValueError(
            f"log_likelihood expects a TFP distribution (model.predictive(x)); got "
            f"{type(predictive).__name__}."
        )
    event = tuple(predictive.event_shape)
    if event and targets.ndim == 1:
        targets = targets.reshape(-1, *event)
    if targets.ndim == 2 and targets.shape[1] == 1 and not event:
        targets = targets[:, 0]
    expected = tuple(predictive.batch_shape) + event
    # log_prob would broadcast one label over every example, or a matrix of them
    if targets.shape != expected:
        raise ValueError(
            f"log_likelihood: targets must have the predictive's shape {expected} (batch "
            f"{tuple(predictive.batch_shape)}, event {event}); got {targets.shape}."
        )
    if targets.size and not np.all(np.isfinite(targets.astype(np.float64))):
        raise ValueError("log_likelihood: targets contain NaN or Inf.")
    if (
        isinstance(predictive, (tfp.distributions.Categorical, tfp.distributions.Bernoulli))
        and targets.size
        and not np.all(targets == np.round(targets))
    ):  # a cast would truncate 2.7 to class 2
        raise ValueError(
            "log_likelihood: a classification predictive takes integer class labels as targets; got "
            f"non-integer values (e.g. {_first_non_integer(targets)})."
        )
    if isinstance(predictive, tfp.distributions.Categorical) and targets.size:
        classes = int(predictive.logits_parameter().shape[-1])
        if targets.min() < 0 or targets.max() >= classes:
            raise ValueError(
                f"log_likelihood: targets must be class labels in [0, {classes}); got range "
                f"[{targets.min()}, {targets.max()}]."
            )
    return float(np.mean(predictive.log_prob(tf.cast(targets, predictive.dtype)).numpy()))


def interval_coverage(lower, upper, targets):
    """Fraction of targets inside [lower, upper] (all output dimensions pooled)."""
    lower, targets = _same_shape(lower, targets, "lower")
    upper, _ = _same_shape(upper, targets, "upper")
    lower, upper = _same_shape(lower, upper, "lower", "upper")
    if np.any(upper < lower):
        raise ValueError("interval_coverage: some upper bounds are below their lower bounds.")
    return float(np.mean((targets >= lower) & (targets <= upper)))


def interval_width(lower, upper):
    """Mean width of the intervals [lower, upper]."""
    lower, upper = _same_shape(lower, upper, "lower", "upper")
    if np.any(upper < lower):
        raise ValueError(
            "interval_width: some upper bounds are below their lower bounds (the width would count "
            "them negative)."
        )
    return float(np.mean(upper - lower))


def auroc(scores_negative, scores_positive):
    """Area under the ROC curve for telling positives from negatives by a score (higher = more likely
    positive): P(s_pos > s_neg) + P(s_pos = s_neg) / 2 (the Mann-Whitney statistic, ties averaged)."""
    neg, pos = (
        _scores(scores_negative, "scores_negative"),
        _scores(scores_positive, "scores_positive"),
    )
    scores = np.concatenate([neg, pos])
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size, np.float64)
    sorted_scores = scores[order]
    # average ranks over ties
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], scores.size]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = 0.5 * (s + e - 1) + 1.0
    u = np.sum(ranks[neg.size :]) - pos.size * (pos.size + 1) / 2.0
    return float(u / (pos.size * neg.size))


def ood_auroc(model, x_in, x_out, batch_size=None):
    """Out-of-distribution detection by a model's uncertainty: AUROC of telling `x_out` (positives) from
    `x_in` by each of the model's uncertainty scores (classification: "total_entropy" (predictive
    entropy), "mutual_information", "expected_entropy"; regression: the variances). Returns a dict."""
    for name, x in (("x_in", x_in), ("x_out", x_out)):
        call_checks.not_empty(x, "ood_auroc", name)
        call_checks.inputs(model, x, "ood_auroc", name)
    u_in = model.uncertainty(x_in, batch_size=batch_size)
    u_out = model.uncertainty(x_out, batch_size=batch_size)
    return {name: auroc(u_in[name], u_out[name]) for name in u_in}


def _scores(values, name):
    try:
        values = np.asarray(values, np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(
            f"auroc: {name} must be numbers; got {np.asarray(values).dtype} values."
        ) from None
    if values.size == 0:
        raise ValueError(f"auroc needs scores of both groups; {name} is empty (0 scores).")
    if not np.all(np.isfinite(values)):
        raise ValueError(
            f"auroc: {name} contains {int(np.sum(~np.isfinite(values)))} NaN or Inf value(s)."
        )
    return values


def _first_non_integer(values):
    return float(values[values != np.round(values)].reshape(-1)[0])


def _same_shape(a, b, name, other="targets"):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.ndim == 2 and a.shape[1] == 1 and b.ndim == 1:
        a = a[:, 0]
    if b.ndim == 2 and b.shape[1] == 1 and a.ndim == 1:
        b = b[:, 0]
    if a.shape != b.shape:
        raise ValueError(
            f"Expected {name} and {other} of the same shape; got {name} {a.shape} and {other} {b.shape}."
        )
    if a.size == 0:
        raise ValueError(
            f"No examples: {name} and {other} have 0 rows (a score of nothing is undefined)."
        )
    for values, label in ((a, name), (b, other)):
        if not np.all(np.isfinite(values)):
            raise ValueError(
                f"{label} contains {int(np.sum(~np.isfinite(values)))} NaN or Inf value(s)."
            )
    return a, b


MAX_BINS = 10_000  # three arrays of this many float64 bins; more resolve nothing on any test set


def _check_bins(num_bins):
    if (
        isinstance(num_bins, bool)
        or not isinstance(num_bins, (int, np.integer))
        or not 1 <= num_bins <= MAX_BINS
    ):
        raise ValueError(f"num_bins must be an integer in [1, {MAX_BINS}]; got {num_bins!r}.")
