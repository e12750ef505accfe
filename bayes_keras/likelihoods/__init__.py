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
    name), a Keras loss object (see `from_keras_loss`) or a config dict."""
    if isinstance(identifier, keras.losses.Loss):
        return from_keras_loss(identifier)
    return resolve(
        identifier, Likelihood, _ALIASES, "a likelihood (a bayes_keras.likelihoods.Likelihood"
    )


def from_keras_loss(loss):
    """The likelihood a Keras loss object stands for, where that is unambiguous.

    SparseCategoricalCrossentropy(from_logits=True) -> Categorical, BinaryCrossentropy(from_logits=True)
    -> Bernoulli, MeanSquaredError -> Normal(). Likelihoods read the model's outputs as logits, so a loss
    with from_logits=False (a softmax / sigmoid output) is refused with what to change, as are losses
    with no likelihood here (one-hot CategoricalCrossentropy, MAE, ...).
    """
    name = type(loss).__name__
    config = loss.get_config()
    logits = config.get("from_logits")
    if config.get("label_smoothing") or config.get("ignore_class") is not None:
        raise ValueError(
            f"{name} with label_smoothing / ignore_class has no likelihood here; use likelihood="
            "'categorical' | 'bernoulli' (plain labels)."
        )
    targets = {"SparseCategoricalCrossentropy": Categorical, "BinaryCrossentropy": Bernoulli}
    if name in targets:
        if not logits:
            raise ValueError(
                f"{name}(from_logits=False) expects probabilities from a softmax / sigmoid output; a BayesianModel's "
                "likelihood averages the particles' probabilities itself and reads the outputs as logits. Remove "
                f"the output activation and pass {name}(from_logits=True) or likelihood="
                f"'{targets[name].name}'."
            )
        return targets[name]()
    if name == "MeanSquaredError":
        return Normal()
    if name == "CategoricalCrossentropy":
        raise ValueError(
            "CategoricalCrossentropy takes one-hot labels; the categorical likelihood takes integer "
            "labels: pass y.argmax(-1) with SparseCategoricalCrossentropy(from_logits=True) or "
            "likelihood='categorical'."
        )
    raise ValueError(
        f"No likelihood corresponds to the Keras loss {name}; use likelihood='categorical' | "
        "'bernoulli' | 'normal' or a bayes_keras.likelihoods object."
    )


def serialize(likelihood):
    return keras.saving.serialize_keras_object(likelihood)


__all__ = [
    "Likelihood",
    "Categorical",
    "Bernoulli",
    "Normal",
    "HeteroscedasticNormal",
    "ParticleMixture",
    "get",
    "serialize",
]
