"""IntervalCoverage: how often the central predictive interval holds the target."""

import keras
import tensorflow as tf

from bayes_keras.metrics.particle_metric import ParticleMetric, check_level, central_interval


@keras.saving.register_keras_serializable(package="bayes_keras")
class IntervalCoverage(ParticleMetric):
    """Fraction of targets inside the central `level` interval of the posterior predictive (regression).

    The interval [q((1 - level) / 2), q((1 + level) / 2)] uses the exact quantiles of the particle mixture
    (bisection on its CDF), per output dimension; a calibrated model covers about `level` of held-out
    targets. Needs a likelihood with a continuous predictive (`bayes_keras.likelihoods.Normal`).

    Example:
        >>> model.compile(optimizer=..., metrics=[bayes_keras.metrics.IntervalCoverage(0.95)])
        >>> model.evaluate(x_test, y_test, return_dict=True)["coverage_95"]
    """

    direction = "up"

    def __init__(self, level=0.95, name=None, dtype=None):
        self.level = check_level(level)
        super().__init__(name=name or f"coverage_{round(100 * self.level):d}", dtype=dtype)

    def values(self, y_true, particle_outputs, likelihood):
        lower, upper, targets = central_interval(y_true, particle_outputs, likelihood, self.level)
        inside = tf.cast((targets >= lower) & (targets <= upper), lower.dtype)
        return tf.reduce_mean(inside, axis=-1)

    def get_config(self):
        return {**super().get_config(), "level": self.level}
