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


def get(identifier):
    """Resolve `None` (the default prior), a `Prior`, a float (Normal scale) or a config dict."""
    from bayes_keras.priors.normal import Normal

    if identifier is None:
        return Normal()
    if isinstance(identifier, Prior):
        return identifier
    if isinstance(identifier, (int, float)) and not isinstance(identifier, bool):
        return Normal(scale=float(identifier))
    if isinstance(identifier, str) and identifier == "he":
        return Normal(scale="he")
    if isinstance(identifier, dict):
        return deserialize(identifier)
    raise ValueError(
        "Expected a prior: a bayes_keras.priors.Prior, a positive float (scale of a zero-mean "
        f"Normal), 'he', a config dict or None; got {identifier!r}."
    )
