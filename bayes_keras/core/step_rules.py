"""Step rules: turn a direction (per-particle pseudo-gradient) into the step that is subtracted.

optax-style pure pieces: `slots(shape)` names the state a rule needs for a variable of that shape
and `apply(direction, state, learning_rate, step)` returns (step, new_state). State is a dict of
tensors; the Keras optimizer stores it in optimizer variables so it is saved with the model.

Dimension-wise rules (the GPF paper, Sec. 4.4 / App. H) keep ONE second-moment statistic per coordinate,
shared by all particles, so the step is x <- x - P * Delta with the same diagonal P for every particle:
an element-wise Adam would precondition each particle differently and break the affine flow.
"""

import keras
import tensorflow as tf

from bayes_keras._config import Configurable, check_number, config_repr, decay_rate, resolve


def is_second_moment(slot_name):
    """Whether a rule's slot holds a running mean of squares (never negative): "v", "inner_v",
    "signal_square"."""
    return slot_name == "v" or slot_name.endswith("_v") or slot_name.endswith("signal_square")


def signal_share(mean_square, square, correction):
    """|m_hat|^2 / v_hat = mean_square / (square * correction), clipped to [0, 1]: the share of a direction that
    persists from step to step, from the squared norm of its running mean (`mean_square`), the running mean of
    its squared norm (`square`) and their common bias correction 1 - decay^t (Jensen: at most 1). 1 where no
    direction has been seen (square 0)."""
    usable = square > 0.0
    share = mean_square / tf.where(usable, square * correction, tf.ones_like(square))
    return tf.where(usable, tf.minimum(share, 1.0), tf.ones_like(square))


def signal_fraction(mean_square, square, decay):
    """The share of a running mean's steps that is signal, beyond the noise floor: rho = `signal_share`(|m|^2,
    v) of the uncorrected averages m <- decay m + (1 - decay) step, v <- decay v + (1 - decay) |step|^2 lies in
    [0, 1]; steps of pure noise leave it at c = (1 - decay) / (1 + decay) on average, consistent steps at 1,
    so the signal's share is (rho - c) / (1 - c), clipped to [0, 1] (1 before any step, and for decay 0).
    Multiplied into a step size it moves fast while the steps agree and averages the noise once they do not
    (Balles, Romero & Hennig 2017, "Coupling Adaptive Batch Sizes with Learning Rates",
    https://arxiv.org/abs/1612.05086). Used by MGVBP's full-precision blocks."""
    rho = signal_share(mean_square, square, 1.0)
    noise = (1.0 - decay) / (1.0 + decay)
    share = tf.clip_by_value((rho - noise) / tf.maximum(1.0 - noise, 1e-6), 0.0, 1.0)
    return tf.where(decay > 0.0, share, tf.ones_like(share))


class StepRule(Configurable):
    """Base class. `particle_shared` slots have shape[1:] (no particle axis)."""

    def slots(self, shape):
        return {}

    def apply(self, direction, state, learning_rate, step):
        raise NotImplementedError

    def __repr__(self):
        return config_repr(self)



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


@keras.saving.register_keras_serializable(package="bayes_keras.step_rules")
class SignalShare(StepRule):
    """Another rule's step times the share of the direction that persists from step to step (composition,
    as optax's `chain`): per variable, rho = |m_hat|^2 / v_hat in [0, 1] with m the running mean of the
    (N, ...) direction and v the running mean of its squared norm (decay `decay`, both bias-corrected;
    Jensen: |m_hat|^2 <= v_hat). Directions that agree (full batch, far from a fixed point, or converging
    to it) keep rho near 1; minibatch noise around a fixed point drives it toward (1 - decay) / (1 + decay)
    (0.05 at 0.9), shrinking the step as the optimal step of a noisy gradient shrinks (Balles, Romero &
    Hennig 2017, "Coupling Adaptive Batch Sizes with Learning Rates", https://arxiv.org/abs/1612.05086). A
    positive factor shared by all particles of a variable: a coupled flow's fixed points (GPF's, SVGD's)
    are unchanged.

    Example:
        >>> opt = GaussianParticleFlow(step_rule=SignalShare(DimWiseRMSProp()))   # or step_rule="signal_rmsprop"
    """

    def __init__(self, rule="rmsprop", decay=0.9):
        self.rule = get(rule)
        self.decay = decay_rate(decay, "SignalShare decay")

    def slots(self, shape):
        return {**{f"inner_{k}": v for k, v in self.rule.slots(shape).items()}, "signal_mean": tuple(shape),
                "signal_square": ()}

    def apply(self, direction, state, learning_rate, step):
        inner = {k[len("inner_"):]: v for k, v in state.items() if k.startswith("inner_")}
        update, inner = self.rule.apply(direction, inner, learning_rate, step)
        mean = self.decay * state["signal_mean"] + (1.0 - self.decay) * direction
        square = self.decay * state["signal_square"] + (1.0 - self.decay) * tf.reduce_sum(tf.square(direction))
        correction = 1.0 - tf.pow(tf.constant(self.decay, direction.dtype), tf.cast(step, direction.dtype))
        share = signal_share(tf.reduce_sum(tf.square(mean)), square, correction)
        return update * share, {**{f"inner_{k}": v for k, v in inner.items()}, "signal_mean": mean,
                                "signal_square": square}

    def get_config(self):
        return {"rule": keras.saving.serialize_keras_object(self.rule), "decay": self.decay}

    def __repr__(self):
        return f"SignalShare(rule={self.rule!r}, decay={self.decay!r})"

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["rule"] = get(config["rule"])
        return cls(**config)


_RULES = {"sgd": SGD, "rmsprop": DimWiseRMSProp, "dimwise_rmsprop": DimWiseRMSProp,
          "adam": DimWiseAdam, "dimwise_adam": DimWiseAdam, "elementwise_adam": Adam,
          "signal_rmsprop": lambda: SignalShare(DimWiseRMSProp())}


def get(identifier):
    return resolve(identifier, StepRule, _RULES, "a step rule (a StepRule")
