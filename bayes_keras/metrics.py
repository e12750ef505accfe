"""Calibration and accuracy of a predictive distribution: functions on numpy arrays, and Keras metrics.

All functions take predictive class probabilities `probs` (n, K) (e.g. `model.predict(x)`) and
integer labels (n,).
"""

import keras
import numpy as np
import tensorflow as tf

_EPS = 1e-12


def _check(probs, labels):
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if probs.ndim != 2 or probs.shape[0] != labels.shape[0]:
        raise ValueError(f"Expected probs (n, K) and labels (n,); got {probs.shape} and {labels.shape}.")
    if labels.min() < 0 or labels.max() >= probs.shape[1]:
        raise ValueError(f"Labels must be in [0, {probs.shape[1]}); got range [{labels.min()}, {labels.max()}].")
    return probs, labels


def accuracy(probs, labels):
    probs, labels = _check(probs, labels)
    return float(np.mean(np.argmax(probs, 1) == labels))


def nll(probs, labels):
    """Mean negative log predictive probability of the true class."""
    probs, labels = _check(probs, labels)
    return float(-np.mean(np.log(probs[np.arange(len(labels)), labels] + _EPS)))


def brier(probs, labels):
    """Mean over examples of sum_k (p_k - 1[y = k])^2 (range [0, 2])."""
    probs, labels = _check(probs, labels)
    onehot = np.eye(probs.shape[1])[labels]
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def calibration_curve(probs, labels, num_bins=15):
    """Per equal-width confidence bin: (mean confidence, accuracy, count)."""
    probs, labels = _check(probs, labels)
    conf = probs.max(1)
    correct = (probs.argmax(1) == labels).astype(np.float64)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    idx = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, num_bins - 1)
    count = np.bincount(idx, minlength=num_bins).astype(np.float64)
    conf_sum = np.bincount(idx, weights=conf, minlength=num_bins)
    acc_sum = np.bincount(idx, weights=correct, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return conf_sum / count, acc_sum / count, count


def ece(probs, labels, num_bins=15):
    """Expected calibration error (top-label, equal-width bins): sum_b |acc_b - conf_b| n_b / n."""
    conf, acc, count = calibration_curve(probs, labels, num_bins)
    mask = count > 0
    return float(np.sum(np.abs(acc[mask] - conf[mask]) * count[mask]) / np.sum(count))


def evaluate_probs(probs, labels, num_bins=15):
    """Dict of accuracy, nll, ece, brier."""
    return {"accuracy": accuracy(probs, labels), "nll": nll(probs, labels),
            "ece": ece(probs, labels, num_bins), "brier": brier(probs, labels)}


@keras.saving.register_keras_serializable(package="bayes_keras")
class ExpectedCalibrationError(keras.metrics.Metric):
    """ECE as a streaming Keras metric over predictive probabilities (batch, K) and integer labels.

    Example:
        >>> model.compile(optimizer=..., metrics=["accuracy", bayes_keras.metrics.ExpectedCalibrationError()])
    """

    def __init__(self, num_bins=15, name="ece", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_bins = num_bins
        self.count = self.add_variable((num_bins,), initializer="zeros", name="count")
        self.conf_sum = self.add_variable((num_bins,), initializer="zeros", name="conf_sum")
        self.acc_sum = self.add_variable((num_bins,), initializer="zeros", name="acc_sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = tf.convert_to_tensor(y_pred)
        labels = tf.cast(tf.reshape(y_true, [-1]), tf.int64)
        conf = tf.reduce_max(y_pred, axis=-1)
        correct = tf.cast(tf.equal(tf.argmax(y_pred, -1), labels), y_pred.dtype)
        idx = tf.clip_by_value(tf.cast(tf.math.ceil(conf * self.num_bins) - 1, tf.int32), 0, self.num_bins - 1)
        self.count.assign_add(tf.math.unsorted_segment_sum(tf.ones_like(conf), idx, self.num_bins))
        self.conf_sum.assign_add(tf.math.unsorted_segment_sum(conf, idx, self.num_bins))
        self.acc_sum.assign_add(tf.math.unsorted_segment_sum(correct, idx, self.num_bins))

    def result(self):
        total = tf.maximum(tf.reduce_sum(self.count), 1.0)
        return tf.reduce_sum(tf.abs(self.acc_sum - self.conf_sum)) / total

    def get_config(self):
        return {**super().get_config(), "num_bins": self.num_bins}


@keras.saving.register_keras_serializable(package="bayes_keras")
class BrierScore(keras.metrics.MeanMetricWrapper):
    """Brier score of predictive probabilities (batch, K) against integer labels.

    Example:
        >>> model.compile(optimizer=..., metrics=[bayes_keras.metrics.BrierScore()])
    """

    def __init__(self, name="brier", **kwargs):
        super().__init__(fn=_brier_fn, name=name, **kwargs)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


def _brier_fn(y_true, y_pred):
    k = tf.shape(y_pred)[-1]
    onehot = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), k, dtype=y_pred.dtype)
    return tf.reduce_sum(tf.square(y_pred - onehot), axis=-1)
