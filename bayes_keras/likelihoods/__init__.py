"""Observation models p(y | x, w) over per-particle outputs."""

import keras

from bayes_keras._config import resolve
from bayes_keras.likelihoods.bernoulli import Bernoulli
from bayes_keras.likelihoods.categorical import Categorical
from bayes_keras.likelihoods.heteroscedastic_normal import HeteroscedasticNormal
from bayes_keras.likelihoods.likelihood import Likelihood
from bayes_keras.likelihoods.normal import Normal
from bayes_keras.likelihoods.particle_mixture import ParticleMixture

_ALIASES = {
    "categorical": Categorical,
    "sparse_categorical_crossentropy": Categorical,
    "bernoulli": Bernoulli,
    "binary_crossentropy": Bernoulli,
    "normal": Normal,
    "gaussian": Normal,
    "mse": Normal,
    "mean_squared_error": Normal,
    "heteroscedastic_normal": HeteroscedasticNormal,
}


def get(identifier):
    """Resolve a Likelihood, a name ('categorical', 'bernoulli', 'normal' or the matching Keras loss
    name) or a config dict."""
    return resolve(identifier, Likelihood, _ALIASES, "a likelihood (a bayes_keras.likelihoods.Likelihood")


def serialize(likelihood):
    return keras.saving.serialize_keras_object(likelihood)


__all__ = ["Likelihood", "Categorical", "Bernoulli", "Normal", "HeteroscedasticNormal", "ParticleMixture", "get", "serialize"]
