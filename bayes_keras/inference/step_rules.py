"""Step rules: turn a direction (per-particle pseudo-gradient) into the step that is subtracted.

optax-style pure pieces: `slots(shape)` names the state a rule needs for a variable of that shape
and `apply(direction, state, learning_rate, step)` returns (step, new_state). State is a dict of
tensors; the Keras optimizer stores it in optimizer variables so it is saved with the model.

Dimension-wise rules (gpf.md, Sec. 4.4 / App. H) keep ONE second-moment statistic per coordinate,
shared by all particles, so the step is x <- x - P * Delta with the same diagonal P for every particle:
an element-wise Adam would precondition each particle differently and break the affine flow.
"""

import keras
import tensorflow as tf

from bayes_keras._config import Configurable, check_number, resolve


def decay_rate(value, what):
    """A moving average's decay in [0, 1) (a ValueError otherwise: 1 or more never forgets, or diverges)."""
    value = check_number(value, what, positive=False)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{what} must be in [0, 1); got {value!r}.")
    return value


class StepRule(Configurable):
    """Base class. `particle_shared` slots have shape[1:] (no particle axis)."""

    def slots(self, shape):
        return {}

    def apply(self, direction, state, learning_rate, step):
        raise NotImplementedError



@keras.saving.register_keras_serializable(package="bayes_keras.step_rules")
class SGD(StepRule):
    """step = learning_rate * direction."""

    def apply(self, direction, state, learning_rate, step):
        return learning_rate * direction, state


@keras.saving.register_keras_serializable(package="bayes_keras.step_rules")
class DimWiseRMSProp(StepRule):
    """RMSProp whose second moment is averaged over particles: v_d = rho v_d + (1 - rho) mean_n Delta_nd^2."""

    def __init__(self, rho=0.9, epsilon=1e-8):
        self.rho, self.epsilon = decay_rate(rho, "rho"), check_number(epsilon, "epsilon")

    def slots(self, shape):
        return {"v": tuple(shape[1:])}

    def apply(self, direction, state, learning_rate, step):
        v = self.rho * state["v"] + (1.0 - self.rho) * tf.reduce_mean(tf.square(direction), axis=0)
        return direction * (learning_rate / (tf.sqrt(v) + self.epsilon)), {"v": v}  # one pass over (N, ...)

    def get_config(self):
        return {"rho": self.rho, "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="bayes_keras.step_rules")
class Adam(StepRule):
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

    def apply(self, direction, state, learning_rate, step):
        m = self.beta_1 * state["m"] + (1.0 - self.beta_1) * direction
        v = self.beta_2 * state["v"] + (1.0 - self.beta_2) * self._squared(direction)
        t = tf.cast(step, direction.dtype)
        # m_hat / (sqrt(v_hat) + eps) with m_hat = m / c1, v_hat = v / c2^2 is (c2 / c1) m / (sqrt(v) + eps c2):
        # the bias corrections become scalars instead of two passes over every (N, ...) slot.
        c1 = 1.0 - tf.pow(tf.constant(self.beta_1, t.dtype), t)
        c2 = tf.sqrt(1.0 - tf.pow(tf.constant(self.beta_2, t.dtype), t))
        # (a dimension-wise v has no particle axis: the division is then on the small tensor)
        return m * ((learning_rate * c2 / c1) / (tf.sqrt(v) + self.epsilon * c2)), {"m": m, "v": v}

    def get_config(self):
        return {"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="bayes_keras.step_rules")
class DimWiseAdam(Adam):
    """Adam with per-particle first moment and a particle-shared second moment (bias-corrected)."""

    def slots(self, shape):
        return {"m": tuple(shape), "v": tuple(shape[1:])}

    def _squared(self, direction):
        return tf.reduce_mean(tf.square(direction), axis=0)


_RULES = {"sgd": SGD, "rmsprop": DimWiseRMSProp, "dimwise_rmsprop": DimWiseRMSProp,
          "adam": DimWiseAdam, "dimwise_adam": DimWiseAdam, "elementwise_adam": Adam}


def get(identifier):
    return resolve(identifier, StepRule, _RULES, "a step rule (a StepRule")
