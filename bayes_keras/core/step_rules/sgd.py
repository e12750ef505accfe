"""SGD: the step is the learning rate times the direction."""

import keras

from bayes_keras.core.step_rules.base import StepRule, register


@keras.saving.register_keras_serializable(package="bayes_keras.step_rules")
@register("sgd")
class SGD(StepRule):
    """step = learning_rate * direction."""

    def apply(self, direction, state, learning_rate, iteration):
        return learning_rate * direction, state
