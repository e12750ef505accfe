"""BrierScore: the multi-class Brier score of predictive probabilities as a Keras metric."""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="bayes_keras")
class BrierScore(keras.metrics.MeanMetricWrapper):
    """Mean over examples of sum_k (p_k - 1[y = k])^2 (Brier 1950; range [0, 2], lower is better).

    Inputs: predictive probabilities (batch, K) and integer labels, or for a binary (Bernoulli) model the
    probability of class 1, (batch,) or (batch, 1) (then the score is 2 (p - y)^2, the K = 2 form).

    Example:
        >>> model.compile(optimizer=..., metrics=[bayes_keras.metrics.BrierScore()])
    """

    def __init__(self, name="brier", dtype=None):
        super().__init__(fn=brier_per_example, name=name, dtype=dtype)
        self._direction = "down"  # what Keras' MonitorCallback reads for mode="auto"

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


def brier_per_example(y_true, y_pred):
    """(batch,) sum_k (p_k - 1[y = k])^2 (tfp.stats.brier_score plus its omitted constant 1)."""
    probs = tf.convert_to_tensor(y_pred)
    if probs.shape.rank == 1 or probs.shape[-1] == 1:
        p1 = tf.reshape(probs, (-1,))
        probs = tf.stack([1.0 - p1, p1], axis=-1)
    onehot = tf.one_hot(
        tf.cast(tf.reshape(y_true, (-1,)), tf.int32), tf.shape(probs)[-1], dtype=probs.dtype
    )
    return tf.reduce_sum(tf.square(probs - onehot), axis=-1)
