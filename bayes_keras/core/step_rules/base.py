"""The step-rule interface, the registry behind `get`, and the signal-share functions the rules and methods share."""

import tensorflow as tf

from bayes_keras._config import Configurable, config_repr, resolve

_RULES = {}  # name -> class or factory, filled by each rule's module (register)


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

    def apply(self, direction, state, learning_rate, iteration):
        raise NotImplementedError

    def __repr__(self):
        return config_repr(self)


def register(*names):
    """Class decorator: the rule answers to `names` in `get` (and step_rule="name" arguments)."""

    def add(cls):
        for name in names:
            _RULES[name] = cls
        return cls

    return add


def get(identifier):
    """A StepRule from an instance, a name (see the package docstring) or a serialized config."""
    return resolve(identifier, StepRule, _RULES, "a step rule (a StepRule")
