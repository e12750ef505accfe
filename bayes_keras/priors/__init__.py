"""Priors over weights: serializable objects with `log_prob`, passed as `kernel_prior=`/`bias_prior=`."""

from bayes_keras.priors.normal import Normal
from bayes_keras.priors.prior import Prior, deserialize, serialize

__all__ = ["Prior", "Normal", "get", "serialize", "deserialize"]


def get(identifier):
    """Resolve `None` (the default prior), a `Prior`, a float (Normal scale) or a config dict."""
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
