"""ExpectedCalibrationError: streaming top-label ECE of predictive class probabilities."""

import keras
import tensorflow as tf

from bayes_keras.metrics.functions import _check_bins


@keras.saving.register_keras_serializable(package="bayes_keras")
class ExpectedCalibrationError(keras.metrics.Metric):
    """ECE (Guo et al. 2017, https://arxiv.org/abs/1706.04599, Eq. 3) as a streaming Keras metric:
    sum_b |accuracy_b - confidence_b| n_b / n over `num_bins` equal-width confidence bins
    [i / B, (i + 1) / B) (the last closed), the binning of `tfp.stats.expected_calibration_error` and of
    `bayes_keras.metrics.ece`.

    Inputs: predictive probabilities (batch, K) and integer labels, or for a binary (Bernoulli) model the
    probability of class 1, (batch,) or (batch, 1), and labels in {0, 1}. Lower is better.

    Example:
        >>> model.compile(optimizer=..., metrics=["accuracy", bayes_keras.metrics.ExpectedCalibrationError()])
    """

    def __init__(self, num_bins=15, name="ece", dtype=None):
        super().__init__(name=name, dtype=dtype)
        _check_bins(num_bins)
        self.num_bins = int(num_bins)
        self._direction = "down"  # what Keras' MonitorCallback reads for mode="auto"
        self.count = self.add_variable(
            (self.num_bins,), initializer="zeros", name="count", dtype="float64"
        )
        self.conf_sum = self.add_variable(
            (self.num_bins,), initializer="zeros", name="conf_sum", dtype="float64"
        )
        self.acc_sum = self.add_variable(
            (self.num_bins,), initializer="zeros", name="acc_sum", dtype="float64"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        probs = tf.cast(tf.convert_to_tensor(y_pred), tf.float64)
        if probs.shape.rank == 1 or probs.shape[-1] == 1:  # binary: probability of class 1
            p1 = tf.reshape(probs, (-1,))
            probs = tf.stack([1.0 - p1, p1], axis=-1)
        labels = tf.cast(tf.reshape(y_true, (-1,)), tf.int64)
        conf = tf.reduce_max(probs, axis=-1)
        correct = tf.cast(tf.equal(tf.argmax(probs, -1), labels), tf.float64)
        weights = (
            tf.ones_like(conf)
            if sample_weight is None
            else tf.cast(tf.reshape(sample_weight, (-1,)), tf.float64)
        )
        idx = tf.minimum(tf.cast(tf.floor(conf * self.num_bins), tf.int32), self.num_bins - 1)
        self.count.assign_add(tf.math.unsorted_segment_sum(weights, idx, self.num_bins))
        self.conf_sum.assign_add(tf.math.unsorted_segment_sum(weights * conf, idx, self.num_bins))
        self.acc_sum.assign_add(tf.math.unsorted_segment_sum(weights * correct, idx, self.num_bins))

    def result(self):
        total = tf.maximum(tf.reduce_sum(self.count), 1e-300)
        return tf.cast(tf.reduce_sum(tf.abs(self.acc_sum - self.conf_sum)) / total, self.dtype)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "num_bins": self.num_bins}
