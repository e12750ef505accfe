"""bayesianize: turn a Keras model into a BayesianModel with particle layers."""

import inspect

import keras
import numpy as np

from bayes_keras import layers as particle_layers
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.model import BayesianModel
from bayes_keras.particle_initialization import initialize_particles

# Keras layer class -> the particle layer with the same constructor arguments.
_PARTICLE_TWINS = {
    keras.layers.Dense: particle_layers.Dense,
    keras.layers.Conv1D: particle_layers.Conv1D,
    keras.layers.Conv2D: particle_layers.Conv2D,
    keras.layers.SimpleRNN: particle_layers.SimpleRNN,
    keras.layers.LSTM: particle_layers.LSTM,
    keras.layers.GRU: particle_layers.GRU,
    keras.layers.MaxPooling2D: particle_layers.MaxPooling2D,
    keras.layers.AveragePooling2D: particle_layers.AveragePooling2D,
    keras.layers.GlobalAveragePooling1D: particle_layers.GlobalAveragePooling1D,
    keras.layers.GlobalAveragePooling2D: particle_layers.GlobalAveragePooling2D,
    keras.layers.GlobalMaxPooling1D: particle_layers.GlobalMaxPooling1D,
    keras.layers.GlobalMaxPooling2D: particle_layers.GlobalMaxPooling2D,
    keras.layers.Flatten: particle_layers.Flatten,
    keras.layers.BatchNormalization: particle_layers.BatchNormalization,
    keras.layers.Embedding: particle_layers.Embedding,
}
_SQUASHING = {keras.activations.softmax: "categorical", keras.activations.sigmoid: "bernoulli"}


def bayesianize(model, num_particles=10, likelihood=None, kernel_prior=None, bias_prior=None, deterministic=(),
                center=True, noise_std=0.1, seed=None):
    """A BayesianModel with the architecture of the Keras `model`, its layers replaced by particle layers.

    Dense, Conv1D, Conv2D, SimpleRNN, LSTM, GRU, pooling, global pooling and Flatten become their
    `bayes_keras.layers` twins (same constructor arguments, `num_particles` on the first one); layers
    that act on the last axis or elementwise (Activation, Dropout, Add, Concatenate, LayerNormalization,
    ...) are kept; a layer that would mix particles or has no twin (BatchNormalization, Embedding,
    MultiHeadAttention, ...) is named in a ValueError. A softmax / sigmoid on the output layer is removed
    (the likelihood averages the particles' probabilities from logits) and picks the likelihood when
    none is given.

    With `center=True` (and a built model) every particle starts at `model`'s weights plus
    N(0, noise_std^2) noise (the MOPED idea: Krishnan et al. 2020, https://arxiv.org/abs/1906.05323), so a
    trained network's accuracy is where training starts; shared (`deterministic`) layers copy them.

    Args:
        model: a built keras.Sequential or functional keras.Model.
        num_particles: N.
        likelihood: for the BayesianModel; default from the output activation (softmax -> "categorical",
            sigmoid -> "bernoulli"), else required.
        kernel_prior, bias_prior: priors of every converted layer (default N(0, 1)).
        deterministic: names of layers to keep as shared point estimates (hybrid nets), or a callable
            layer -> bool.
        center, noise_std, seed: start the particles at the model's weights (see above).

    Example:
        >>> cnn = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(6, 5, activation="relu"),
        ...                         keras.layers.MaxPooling2D(), keras.layers.Flatten(),
        ...                         keras.layers.Dense(10, activation="softmax")])
        >>> cnn.fit(x, y)                                        # a trained Keras model
        >>> model = bayes_keras.bayesianize(cnn, num_particles=10)   # categorical, particles around cnn
        >>> model.compile(optimizer=bayes_keras.optimizers.GaussianParticleFlow(1e-3))
        >>> model.fit(x, y, epochs=5)
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"bayesianize expects a keras.Model (Sequential or functional); got {type(model).__name__}.")
    try:
        inputs, outputs = model.inputs, model.outputs
    except (AttributeError, ValueError):
        inputs = outputs = None
    if not inputs or not outputs:
        raise ValueError(f"bayesianize needs a built Sequential or functional model with defined inputs "
                         f"(start it with keras.Input(shape)); '{model.name}' has none.")
    functional = model if not isinstance(model, keras.Sequential) else keras.Model(inputs, outputs)
    is_deterministic = deterministic if callable(deterministic) else (lambda layer: layer.name in set(deterministic))
    output_layer = model.layers[-1]
    output_activation = getattr(output_layer, "activation", None)
    if likelihood is None:
        likelihood = _SQUASHING.get(output_activation)
        if likelihood is None:
            raise ValueError("bayesianize: pass likelihood= ('categorical', 'bernoulli', 'normal' or a "
                             "bayes_keras.likelihoods object); the output layer has no softmax / sigmoid to infer it "
                             "from.")
    unsupported = sorted({type(l).__name__ for l in functional.layers if _unsupported(l)})
    if unsupported:
        raise ValueError(f"bayesianize: no particle version of {unsupported} (they would mix particles or drop "
                         "the particle axis); supported: " + ", ".join(sorted(c.__name__ for c in _PARTICLE_TWINS))
                         + ", and layers that act per example on the last axis (Activation, Dropout, Add, "
                         "Concatenate, LayerNormalization, Reshape of trailing axes).")
    pairs = []
    carries_particles = set()

    def convert(layer, *args, **kwargs):
        has_particles = any(id(t) in carries_particles for t in keras.tree.flatten((args, kwargs)))
        twin = _PARTICLE_TWINS.get(type(layer))
        if twin is None:
            new = layer.__class__.from_config(layer.get_config())
        else:
            config = _twin_config(layer, twin)
            if layer is output_layer and output_activation in _SQUASHING:
                config["activation"] = None
            if layer.weights:
                config.update(deterministic=bool(is_deterministic(layer)), kernel_prior=kernel_prior,
                              bias_prior=bias_prior)
            if not has_particles:
                config["num_particles"] = num_particles
            new = twin(**config)
        accepted = inspect.signature(new.call).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        dropped = {k: v for k, v in kwargs.items() if not takes_any and k not in accepted and k != "training"}
        if any(v is not None for v in dropped.values()):
            raise ValueError(f"bayesianize: layer '{layer.name}' is called with {sorted(dropped)}, which "
                             f"{type(new).__name__} does not take (e.g. masks through recurrent layers).")
        result = new(*args, **{k: v for k, v in kwargs.items() if k not in dropped})
        if twin is not None or has_particles:
            carries_particles.update(id(t) for t in keras.tree.flatten(result))
        pairs.append((layer, new))
        return result

    clone = keras.models.clone_model(functional, clone_function=lambda layer: layer, call_function=convert)
    bayesian = BayesianModel(clone.inputs, clone.outputs, likelihood=likelihood, name=f"bayesian_{model.name}")
    if center:
        rng = np.random.default_rng(seed)
        for original, new in pairs:
            if isinstance(new, ParticleLayer) and new.weights:
                trained = [v.numpy() for v in original.trainable_weights]
                initialize_particles([new], trained, noise_std, seed=int(rng.integers(2**31)))
                # statistics (BatchNormalization's moving averages): the same for every particle
                for target, value in zip(new.non_trainable_weights, original.non_trainable_weights):
                    target.assign(np_broadcast(value.numpy(), target.shape))
            elif new.weights:
                new.set_weights(original.get_weights())
    return bayesian


def np_broadcast(value, shape):
    return np.broadcast_to(value, tuple(shape)).copy()


def _twin_config(layer, twin):
    """The Keras layer's constructor arguments that its particle twin accepts (regularizers and constraints
    are not: the prior takes their place)."""
    accepted = set(inspect.signature(twin.__init__).parameters)
    for base in twin.__mro__[1:]:
        if base is keras.layers.Layer:
            break
        accepted |= set(inspect.signature(base.__init__).parameters)
    accepted |= {"name", "dtype", "trainable"}
    config = layer.get_config()
    return {k: v for k, v in config.items() if k in accepted}


def _unsupported(layer):
    mixing = (keras.layers.GroupNormalization, keras.layers.MultiHeadAttention,
              keras.layers.Bidirectional, keras.layers.Conv3D, keras.layers.MaxPooling1D,
              keras.layers.AveragePooling1D, keras.layers.MaxPooling3D, keras.layers.AveragePooling3D,
              keras.layers.GlobalAveragePooling3D, keras.layers.GlobalMaxPooling3D, keras.layers.Conv2DTranspose,
              keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D, keras.layers.UpSampling2D,
              keras.layers.ZeroPadding2D, keras.layers.Cropping2D)
    return isinstance(layer, mixing)
