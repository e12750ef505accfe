"""DimWiseRMSProp: RMSProp with one second moment per coordinate, shared by the particles."""

import keras
import tensorflow as tf

from bayes_keras._config import check_number, decay_rate
from bayes_keras.core.step_rules.base import StepRule, register


@keras.saving.register_keras_serializable(package="bayes_keras.step_rules")
@register("rmsprop", "dimwise_rmsprop")
class DimWiseRMSProp(StepRule):
    """RMSProp whose second moment is averaged over particles: v_d = rho v_d + (1 - rho) mean_n Delta_nd^2."""

    def __init__(self, rho=0.9, epsilon=1e-8):
        self.rho, self.epsilon = decay_rate(rho, "rho"), check_number(epsilon, "epsilon")

    def slots(self, shape):
        return {"v": tuple(shape[1:])}

    def apply(self, direction, state, learning_rate, iteration):
        v = self.rho * state["v"] + (1.0 - self.rho) * tf.reduce_mean(tf.square(direction), axis=0)
        return direction * (learning_rate / (tf.sqrt(v) + self.epsilon)), {
            "v": v
        }  # one pass over (N, ...)

    def get_config(self):
        return {"rho": self.rho, "epsilon": self.epsilon}
