"""Priors over weights: serializable objects with `log_prob`, passed as `kernel_prior=`/`bias_prior=`."""

from bayes_keras.priors.normal import Normal
from bayes_keras.priors.prior import Prior, get, serialize, deserialize

__all__ = ["Prior", "Normal", "get", "serialize", "deserialize"]
