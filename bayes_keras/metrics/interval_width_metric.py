"""IntervalWidth: the mean width of the central predictive interval."""

import keras
import tensorflow as tf

from bayes_keras.metrics.particle_metric import ParticleMetric, check_level, central_interval


@keras.saving.register_keras_serializable(package="bayes_keras")
class IntervalWidth(ParticleMetric):
    """Mean width of the central `level` interval of the posterior predictive (regression; in the targets'
    units, averaged over output dimensions). Read next to `IntervalCoverage`: the narrowest intervals that
    still cover `level` of the targets are best.

    Example:
        >>> model.compile(optimizer=..., metrics=[bayes_keras.metrics.IntervalCoverage(),
        ...                                       bayes_keras.metrics.IntervalWidth()])
    """

    direction = "down"

    def __init__(self, level=0.95, name=None, dtype=None):
        self.level = check_level(level)
        super().__init__(name=name or f"width_{round(100 * self.level):d}", dtype=dtype)

    def values(self, y_true, particle_outputs, likelihood):
        lower, upper, _ = central_interval(y_true, particle_outputs, likelihood, self.level)
        return tf.reduce_mean(upper - lower, axis=-1)

    def get_config(self):
        return {**super().get_config(), "level": self.level}
