"""DimWiseAdam: Adam whose second moment is shared by the particles (the GPF paper's dimension-wise Adam)."""

import keras
import tensorflow as tf

from bayes_keras.core.step_rules.elementwise_adam import ElementwiseAdam
from bayes_keras.core.step_rules.base import register


@keras.saving.register_keras_serializable(package="bayes_keras.step_rules")
@register("adam", "dimwise_adam")
class DimWiseAdam(ElementwiseAdam):
    """Adam with per-particle first moment and a particle-shared second moment (bias-corrected)."""

    def slots(self, shape):
        return {"m": tuple(shape), "v": tuple(shape[1:])}

    def _squared(self, direction):
        return tf.reduce_mean(tf.square(direction), axis=0)
