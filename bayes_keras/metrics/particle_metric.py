"""ParticleMetric: a Keras metric of the posterior predictive, computed from the per-particle outputs."""

import keras
import tensorflow as tf


class ParticleMetric(keras.metrics.Metric):
    """Base class of metrics that need the whole predictive distribution, not only `model.predict`'s
    summary (a regression interval needs the particle mixture, a predictive log density every particle).

    A BayesianModel hands these metrics, when passed to `compile(metrics=[...])`, the per-particle outputs
    (batch, N, ...) and its likelihood; other Keras metrics get the predictive summary (class
    probabilities, or the predictive mean for a Normal likelihood). Subclasses implement

        values(y_true, particle_outputs, likelihood) -> (batch,) per-example values

    and inherit a streaming, `sample_weight`-weighted mean over examples (independent of the batch
    size). `direction` ("down": lower is better, or "up") lets Keras callbacks with mode="auto"
    (EarlyStopping, ModelCheckpoint) pick min or max.

    Example:
        >>> class MeanAbsoluteError(bayes_keras.metrics.ParticleMetric):
        ...     def values(self, y_true, particle_outputs, likelihood):
        ...         mean = likelihood.summary(particle_outputs)["mean"]
        ...         return tf.reduce_mean(tf.abs(tf.reshape(y_true, tf.shape(mean)) - mean), axis=-1)
    """

    direction = "down"

    def __init__(self, name=None, dtype=None):
        super().__init__(name=name, dtype=dtype)
        if self.direction not in ("up", "down"):
            raise ValueError(
                f"{type(self).__name__}.direction must be 'up' or 'down'; got {self.direction!r}."
            )
        self._direction = self.direction  # what Keras' MonitorCallback reads for mode="auto"
        self.total = self.add_variable((), initializer="zeros", name="total", dtype="float64")
        self.count = self.add_variable((), initializer="zeros", name="count", dtype="float64")

    def values(self, y_true, particle_outputs, likelihood):
        raise NotImplementedError(
            f"{type(self).__name__} must implement values(y_true, particle_outputs, "
            "likelihood) -> (batch,) per-example values."
        )

    def update_state(self, y_true, particle_outputs, likelihood, sample_weight=None):
        values = tf.cast(self.values(y_true, particle_outputs, likelihood), tf.float64)
        weights = (
            tf.ones_like(values)
            if sample_weight is None
            else tf.broadcast_to(
                tf.cast(tf.reshape(sample_weight, (-1,)), tf.float64), tf.shape(values)
            )
        )
        self.total.assign_add(tf.reduce_sum(values * weights))
        self.count.assign_add(tf.reduce_sum(weights))

    def result(self):
        return tf.cast(tf.math.divide_no_nan(self.total, self.count), self.dtype)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype}


def check_level(level):
    """A central interval's probability, strictly between 0 and 1."""
    if (
        isinstance(level, bool)
        or not isinstance(level, (int, float))
        or not 0.0 < float(level) < 1.0
    ):
        raise ValueError(
            f"level must be a probability strictly between 0 and 1 (e.g. 0.95); got {level!r}."
        )
    return float(level)


def central_interval(y_true, particle_outputs, likelihood, level):
    """(lower, upper, targets), each (batch, d): the central `level` interval of the predictive."""
    lower, upper = likelihood.predictive_interval(particle_outputs, level)
    targets = tf.reshape(tf.cast(y_true, lower.dtype), tf.shape(lower))
    return lower, upper, targets
