"""Base class of weight priors and the (de)serialisation helpers."""

import keras

from bayes_keras._config import Configurable


class Prior(Configurable):
    """A prior density over one weight tensor, evaluated per particle.

    Subclasses implement `log_prob(value, fan_in)` returning the elementwise log density of
    `value` (any shape). `fan_in` is the layer's fan-in, for priors whose scale depends on it.
    Layers sum the result over every axis but the particle axis.
    """

    def log_prob(self, value, fan_in):
        raise NotImplementedError

    def stddev(self, fan_in):
        """Standard deviation of the prior for a weight with this fan-in (used to draw samples)."""
        raise NotImplementedError


def serialize(prior):
    return keras.saving.serialize_keras_object(prior)


def deserialize(config):
    return keras.saving.deserialize_keras_object(config)
