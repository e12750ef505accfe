"""Shared plumbing of the library's small serializable objects (priors, likelihoods, step rules,
kernels, preconditioners): a config round trip, and the lookup behind each module's `get()`."""

import math
import numbers

import keras
import tensorflow as tf


class Configurable:
    """`get_config` / `from_config` for objects whose constructor arguments are their whole state."""

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def is_real(value):
    """A real number (int, float, numpy scalar), not a bool: what a numeric argument must be before any
    comparison (a string would otherwise fail with Python's "'<' not supported ..." instead of a message
    naming the argument)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_number(value, what, positive=True, allow_none=False, allow_zero=False):
    """`value` as a float, or a ValueError saying what was expected: a finite number (positive, or
    non-negative with `allow_zero`, unless `positive=False`). Used by constructors AND from_config
    paths, so a saved NaN or inf is refused on load as on construction."""
    if value is None and allow_none:
        return None
    number = is_real(value) and math.isfinite(float(value))
    if number and positive:
        number = float(value) > 0 or (allow_zero and float(value) == 0)
    if not number:
        kind = " non-negative" if allow_zero else " positive" if positive else ""
        raise ValueError(f"{what} must be a finite{kind} number; got {value!r}.")
    return float(value)


def decay_rate(value, what):
    """A moving average's decay in [0, 1) (a ValueError otherwise: 1 or more never forgets, or diverges)."""
    value = check_number(value, what, positive=False)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{what} must be in [0, 1); got {value!r}.")
    return value


def config_repr(obj):
    """`Name(arg=value, ...)` from `obj.get_config()` (for a class's __repr__)."""
    args = ", ".join(f"{k}={v!r}" for k, v in obj.get_config().items())
    return f"{type(obj).__name__}({args})"


def resolve(identifier, base, names, what, default=None):
    """An instance of `base` from an instance, a case-insensitive name in `names` (name -> class, built
    with no arguments), a serialized config, or None (-> `default()`, when given).

    Raises:
        ValueError: naming `what` ("a kernel (a bayes_keras.kernels.Kernel") and the accepted names.
    """
    if isinstance(identifier, base):
        return identifier
    if identifier is None and default is not None:
        return default()
    if isinstance(identifier, str) and identifier.lower() in names:
        return names[identifier.lower()]()
    if isinstance(identifier, dict):
        obj = keras.saving.deserialize_keras_object(identifier)
        if isinstance(obj, base):
            return obj
    raise ValueError(f"Expected {what} or one of {sorted(names)}); got {identifier!r}.")


# Keras optimizer arguments a Bayesian optimizer refuses, and why
_UNSUPPORTED = {
    "weight_decay": "the prior plays the role of weight decay",
    "use_ema": "the particles or q already average over weights; a moving average of them is no sample",
    "gradient_accumulation_steps": "a step's gradients and its StepInfo must come from the same batch",
    "loss_scale_factor": "BayesianModel scales the loss itself under mixed_float16",
}


def check_optimizer_arguments(what, learning_rate, kwargs):
    """A Bayesian optimizer's learning rate, checked (a finite non-negative number: 0 is a frozen run,
    e.g. to read curvature statistics; or a schedule starting at one; or a callable), after refusing the
    Keras optimizer arguments it cannot honour (popped from `kwargs`)."""
    for key, why in _UNSUPPORTED.items():
        if kwargs.get(key):
            raise ValueError(
                f"{what} does not support {key}={kwargs[key]!r}: a Bayesian optimizer's update is its "
                f"inference method ({why})."
            )
        kwargs.pop(key, None)
    if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        check_schedule(learning_rate, f"{what} learning_rate")
        return learning_rate
    if isinstance(learning_rate, dict) or callable(learning_rate):
        return learning_rate
    return check_number(learning_rate, f"{what} learning_rate", allow_zero=True)


def check_schedule(schedule, what):
    """A learning-rate schedule must start at a finite, non-negative rate (a negative one would ascend the
    loss without any error, its updates finite)."""
    with tf.init_scope():
        first = float(tf.convert_to_tensor(schedule(0)))
    if not math.isfinite(first) or first < 0:
        raise ValueError(
            f"{what}: the schedule must give a finite non-negative rate; {type(schedule).__name__} "
            f"gives {first!r} at step 0."
        )
