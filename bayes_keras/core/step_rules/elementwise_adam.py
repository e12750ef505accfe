"""ElementwiseAdam: Adam with moments per coordinate of every particle (Kingma & Ba 2015)."""

import keras
import tensorflow as tf

from bayes_keras._config import check_number, decay_rate
from bayes_keras.core.step_rules.base import StepRule, register


@keras.saving.register_keras_serializable(package="bayes_keras.step_rules")
@register("elementwise_adam")
class ElementwiseAdam(StepRule):
    """Element-wise Adam (Kingma & Ba 2015): every coordinate of every particle has its own moments.

    Right for independent particles (deep ensembles) and for shared deterministic weights; wrong
    for coupled flows such as GPF (use DimWiseAdam there).
    """

    def __init__(self, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
        self.beta_1, self.beta_2 = decay_rate(beta_1, "beta_1"), decay_rate(beta_2, "beta_2")
        self.epsilon = check_number(epsilon, "epsilon")

    def slots(self, shape):
        return {"m": tuple(shape), "v": tuple(shape)}

    def _squared(self, direction):
        return tf.square(direction)

    def apply(self, direction, state, learning_rate, iteration):
        m = self.beta_1 * state["m"] + (1.0 - self.beta_1) * direction
        v = self.beta_2 * state["v"] + (1.0 - self.beta_2) * self._squared(direction)
        t = tf.cast(iteration, direction.dtype)
        # m_hat / (sqrt(v_hat) + eps) with m_hat = m / c1, v_hat = v / c2^2 is (c2 / c1) m / (sqrt(v) + eps c2):
        # the bias corrections become scalars instead of two passes over every (N, ...) slot.
        c1 = 1.0 - tf.pow(tf.constant(self.beta_1, t.dtype), t)
        c2 = tf.sqrt(1.0 - tf.pow(tf.constant(self.beta_2, t.dtype), t))
        # (a dimension-wise v has no particle axis: the division is then on the small tensor)
        return m * ((learning_rate * c2 / c1) / (tf.sqrt(v) + self.epsilon * c2)), {"m": m, "v": v}

    def get_config(self):
        return {"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon}


# Saved before the rename (as "Adam"): files naming it load.
keras.saving.get_custom_objects()["bayes_keras.step_rules>Adam"] = ElementwiseAdam
