"""The step-rule interface and the registry behind `get`."""

from bayes_keras._config import Configurable, config_repr, resolve

_RULES = {}  # name -> class or factory, filled by each rule's module (register)


def is_second_moment(slot_name):
    """Whether a rule's slot holds a running mean of squares (never negative): "v", "inner_v",
    "signal_square"."""
    return slot_name == "v" or slot_name.endswith("_v") or slot_name.endswith("signal_square")


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
