"""SignalShare: another rule's step times the share of the direction that persists from step to step."""

import keras
import tensorflow as tf

from bayes_keras._config import decay_rate
from bayes_keras.core.step_rules.base import StepRule, get, register
from bayes_keras.core.step_rules.signal import signal_share
from bayes_keras.core.step_rules.dimwise_rmsprop import DimWiseRMSProp


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
        return {
            **{f"inner_{k}": v for k, v in self.rule.slots(shape).items()},
            "signal_mean": tuple(shape),
            "signal_square": (),
        }

    def apply(self, direction, state, learning_rate, iteration):
        inner = {k[len("inner_") :]: v for k, v in state.items() if k.startswith("inner_")}
        update, inner = self.rule.apply(direction, inner, learning_rate, iteration)
        mean = self.decay * state["signal_mean"] + (1.0 - self.decay) * direction
        square = self.decay * state["signal_square"] + (1.0 - self.decay) * tf.reduce_sum(
            tf.square(direction)
        )
        correction = 1.0 - tf.pow(
            tf.constant(self.decay, direction.dtype), tf.cast(iteration, direction.dtype)
        )
        share = signal_share(tf.reduce_sum(tf.square(mean)), square, correction)
        return update * share, {
            **{f"inner_{k}": v for k, v in inner.items()},
            "signal_mean": mean,
            "signal_square": square,
        }

    def get_config(self):
        return {"rule": keras.saving.serialize_keras_object(self.rule), "decay": self.decay}

    def __repr__(self):
        return f"SignalShare(rule={self.rule!r}, decay={self.decay!r})"

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["rule"] = get(config["rule"])
        return cls(**config)


register("signal_rmsprop")(lambda: SignalShare(DimWiseRMSProp()))
