"""bayesianize: turn a Keras model into a BayesianModel with particle layers."""

import inspect
import warnings

import keras
import numpy as np

# keras.src: no public name for a graph (functional) model; Sequential is not one
from keras.src.models.functional import Functional
from keras.src.backend import get_keras_mask  # keras.src: masks have no public accessor

from bayes_keras import layers as particle_layers
from bayes_keras import likelihoods as likelihoods_lib
from bayes_keras import priors
from bayes_keras._config import is_real
from bayes_keras.conversion.conversion_report import conversion_report
from bayes_keras.layers import mixing_guard
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.particle_layout import IMAGE_RANK, particle_axis
from bayes_keras.layers.converted import get_sublayer, set_sublayer
from bayes_keras.layers.get_item import encode_key
from bayes_keras.layers.per_particle import PerParticle
from bayes_keras.model import BayesianModel
from bayes_keras.saving.model_serialization import freeze
from bayes_keras.training.particle_initialization import initialize_particles

_L = keras.layers
# Keras layers with weights -> the particle layer with the same constructor arguments (always converted).
_WEIGHT_TWINS = {
    _L.Dense: particle_layers.Dense,
    _L.Conv1D: particle_layers.Conv1D,
    _L.Conv2D: particle_layers.Conv2D,
    _L.DepthwiseConv2D: particle_layers.DepthwiseConv2D,
    _L.SeparableConv2D: particle_layers.SeparableConv2D,
    _L.SimpleRNN: particle_layers.SimpleRNN,
    _L.LSTM: particle_layers.LSTM,
    _L.GRU: particle_layers.GRU,
    _L.Embedding: particle_layers.Embedding,
    _L.EinsumDense: particle_layers.EinsumDense,
    _L.MultiHeadAttention: particle_layers.MultiHeadAttention,
}
# keras.ops elementwise operations -> the Keras merge layer computing the same (for inputs with and without particles)
_MERGE_LAYERS = {
    "Add": _L.Add,
    "Subtract": _L.Subtract,
    "Multiply": _L.Multiply,
    "Maximum": _L.Maximum,
    "Minimum": _L.Minimum,
}
# Layers Bayesian LoRA adapts (with subclasses), and their LoRA twins.
_LORA_TYPES = (_L.Dense, _L.EinsumDense, _L.Embedding, _L.MultiHeadAttention)
# Twins made of particle sublayers: their weights are set sublayer by sublayer (`projections`, in weight order).
_COMPOSITE_TWINS = (particle_layers.MultiHeadAttention,)
# Layers whose particle version is needed only where the particle axis already exists.
_LAYOUT_TWINS = {
    _L.MaxPooling2D: particle_layers.MaxPooling2D,
    _L.AveragePooling2D: particle_layers.AveragePooling2D,
    _L.GlobalAveragePooling1D: particle_layers.GlobalAveragePooling1D,
    _L.GlobalAveragePooling2D: particle_layers.GlobalAveragePooling2D,
    _L.GlobalMaxPooling1D: particle_layers.GlobalMaxPooling1D,
    _L.GlobalMaxPooling2D: particle_layers.GlobalMaxPooling2D,
    _L.Flatten: particle_layers.Flatten,
    _L.BatchNormalization: particle_layers.BatchNormalization,
}
# The Keras classes themselves (their subclasses are checked particle by particle before conversion).
_TWINNED = set(_WEIGHT_TWINS) | set(_LAYOUT_TWINS)
_SQUASHING = {keras.activations.softmax: "categorical", keras.activations.sigmoid: "bernoulli"}
# Arguments a particle twin drops on purpose: the prior takes the place of regularizers and constraints.
_REPLACED_BY_PRIOR = ("regularizer", "constraint")
# Keras stores these defaults resolved (None -> the value)
_RESOLVED = {"data_format": "channels_last"}


def bayesianize(
    model,
    num_particles=10,
    likelihood=None,
    kernel_prior=None,
    bias_prior=None,
    deterministic=(),
    center=True,
    noise_std=0.1,
    seed=None,
    batch_norm_momentum=0.9,
    bayesian=None,
    lora_rank=None,
    lora_alpha=None,
):
    """A BayesianModel with the architecture of the Keras `model`, its weight layers replaced by particle layers.

    The conversion is exact or refused: with `noise_std=0` every particle predicts as `model` does, in
    memory and after a .keras round trip, or a ValueError names the layer it cannot convert.

    - Which part is Bayesian: `bayesian=` (default: every trainable layer with a particle version; a list
      of layer names, where a nested model's name stands for all its layers; an int k: the last k weight
      layers and the normalization layers after the first of them; or a callable layer -> bool), less the
      layers `deterministic=` names (names, nested models' names too, or a callable). Frozen layers
      (trainable=False) stay frozen point estimates unless `bayesian=` names them. The particle axis starts
      at the first Bayesian layer: every layer before it (a frozen backbone, nested models included) stays a
      Keras layer with its weights and runs once per example; after it, non-Bayesian layers with a twin share
      one weight set (frozen ones stay frozen). `bayes_keras.conversion_report(model)` lists every layer.
    - Dense, EinsumDense, Conv1D, Conv2D (groups too), DepthwiseConv2D, SeparableConv2D, SimpleRNN, LSTM, GRU,
      Bidirectional, Embedding and MultiHeadAttention (attention over time) become their `bayes_keras.layers`
      twins (same constructor arguments).
      BatchNormalization, LayerNormalization (of the last axis), pooling, global pooling and Flatten become
      theirs where the particle axis exists; before it (e.g. a Flatten-first MLP) they stay Keras layers.
    - Every other layer is kept with all its state (adapted Normalization statistics, BatchNormalization
      moving averages, any weights). Where it receives particle activations it is kept as it is when it
      acts per element or on the last axis, and otherwise wrapped in `bayes_keras.layers.PerParticle`,
      which runs it on each particle as on an ordinary batch, so that its axis arguments keep their
      meaning (`Softmax(axis=1)` over time stays over time). A kept layer's weights are shared by all
      particles (point estimates; a warning lists them). A layer from outside Keras is kept only if it
      treats the examples of a batch independently (checked once on random inputs); BatchNormalization's
      other axes, Masking after the first weight layer, stateful recurrent layers are refused.
    - A softmax / sigmoid on the output layer is removed (the likelihood averages the particles'
      probabilities from logits) and picks the likelihood when none is given. Constructor arguments a
      twin does not take are refused unless they are at Keras' default; regularizers and constraints
      are dropped with a warning (the prior takes their place).

    With `center=True` every particle starts at `model`'s weights plus Gaussian noise of standard
    deviation `noise_std` times each weight tensor's root mean square (the MOPED idea, Krishnan et al.
    2020, "Specifying Weight Priors in Bayesian Deep Neural Networks with Empirical Bayes",
    https://arxiv.org/abs/1906.05323; see `initialize_particles`), so a trained network's accuracy is
    where training starts and the particles still disagree; shared (`deterministic`) layers copy them.

    Further arguments:

    - kernel_prior, bias_prior: priors of every converted layer (default N(0, 1)).
    - lora_rank, lora_alpha: Bayesian LoRA. The Bayesian layers keep their weights frozen and stored once, and
      get rank-`lora_rank` factors per particle (`layers.LoRAEinsumDense` for Dense and EinsumDense,
      `layers.LoRAEmbedding`, and MultiHeadAttention's query and value projections), the update scaled
      by lora_alpha / rank (default alpha: the rank) as in Keras' `enable_lora`. By default (bayesian=None)
      the attention layers are adapted (every Dense / EinsumDense / Embedding if the model has none) and
      the output layer, a head without pretrained weights to adapt, gets full particles. A layer on which
      Keras' `enable_lora` was called is adapted with its own rank, its factors the particles' centre.
    - center, noise_std, seed: start the particles at the model's weights (see above).

    Args:
        model: a built keras.Sequential or functional keras.Model.
        num_particles: N.
        likelihood: for the BayesianModel; default from the output activation (softmax -> "categorical",
            sigmoid -> "bernoulli"), else required.
        deterministic: names of layers to keep as shared point estimates (hybrid nets), or a callable
            layer -> bool.
        bayesian: which layers carry particles (see above): None, layer names, an int k or a callable.
            Unknown names are refused, for `deterministic` too.
        batch_norm_momentum: momentum of the converted BatchNormalization layers' moving statistics
            (default 0.9; None keeps each Keras layer's own, usually 0.99). The statistics are
            what inference mode normalises with; a Bayesian optimizer keeps the particles moving through
            the posterior, and BatchNormalization makes a kernel's scale free to drift, so a 100-step average
            (0.99) lags the weights: a trained Keras ResNet-20 on the 8x8 digits (inference accuracy 0.978),
            converted with 0.99, fell to 0.19 after one epoch of GaussianParticleFlow() while its
            training-mode accuracy (batch statistics) was 0.94; with 0.9 (about 10 steps) inference follows
            training mode (benchmarks/results/resnet_conversion.md).

    Example:
        >>> cnn = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(6, 5, activation="relu"),
        ...                         keras.layers.MaxPooling2D(), keras.layers.Flatten(),
        ...                         keras.layers.Dense(10, activation="softmax")])
        >>> cnn.fit(x, y)                                        # a trained Keras model
        >>> model = bayes_keras.bayesianize(cnn, num_particles=10)   # categorical, particles around cnn
        >>> model.compile(optimizer=bayes_keras.optimizers.GaussianParticleFlow(1e-3))
        >>> model.fit(x, y, epochs=5)
        >>> backbone = keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(32, 32, 3))
        >>> backbone.trainable = False                           # frozen: runs once per example
        >>> head = keras.layers.Dense(10, activation="softmax")(keras.layers.GlobalAveragePooling2D()(backbone.output))
        >>> model = bayes_keras.bayesianize(keras.Model(backbone.input, head), num_particles=8)  # a Bayesian head
    """
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"bayesianize: model must be a keras.Model (Sequential or functional); got "
            f"{type(model).__name__} {_short(model)}."
        )
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
    ):
        raise ValueError(f"bayesianize: seed must be a non-negative integer or None; got {seed!r}.")
    if not isinstance(center, (bool, np.bool_)):
        raise ValueError(f"bayesianize: center must be True or False; got {center!r}.")
    for name, prior in (("kernel_prior", kernel_prior), ("bias_prior", bias_prior)):
        try:
            priors.get(prior)
        except (ValueError, TypeError) as error:
            raise ValueError(f"bayesianize: {name}={prior!r} is not a prior. {error}") from None
    try:
        inputs, outputs = model.inputs, model.outputs
    except (AttributeError, ValueError):
        inputs = outputs = None
    if not inputs or not outputs:
        raise ValueError(
            f"bayesianize needs a built Sequential or functional model with defined inputs "
            f"(start it with keras.Input(shape)); '{model.name}' has none."
        )
    if len(outputs) != 1:
        raise ValueError(
            f"bayesianize converts models with one output; '{model.name}' has {len(outputs)}."
        )
    if (
        isinstance(num_particles, bool)
        or not isinstance(num_particles, (int, np.integer))
        or num_particles < 1
    ):
        raise ValueError(
            f"bayesianize: num_particles must be a positive integer; got {num_particles!r}."
        )
    # the inputs keep the model's structure (one tensor, a list, a dict): fit, predict and the exported endpoints
    # take them as the Keras model does
    functional = (
        model
        if not isinstance(model, keras.Sequential)
        else keras.Model(inputs[0] if len(inputs) == 1 else inputs, outputs)
    )
    if lora_rank is not None and (
        isinstance(lora_rank, bool) or not isinstance(lora_rank, (int, np.integer)) or lora_rank < 1
    ):
        raise ValueError(
            f"bayesianize: lora_rank must be a positive integer or None; got {lora_rank!r}."
        )
    if lora_alpha is not None and (not is_real(lora_alpha) or not lora_alpha > 0):
        raise ValueError(
            f"bayesianize: lora_alpha must be a positive number or None; got {lora_alpha!r}."
        )
    if lora_alpha is not None and lora_rank is None:
        raise ValueError(
            f"bayesianize: lora_alpha={lora_alpha!r} scales LoRA factors, and there are none without "
            "lora_rank: pass lora_rank=r as well (or leave lora_alpha out)."
        )
    lora_rank = None if lora_rank is None else int(lora_rank)  # np.int64 too
    lora_alpha = None if lora_alpha is None else float(lora_alpha)
    if lora_rank is not None and bayesian is None:
        bayesian = _default_lora_layers(functional)
    is_bayesian = _bayesian_selection(functional, bayesian, deterministic)
    output_layer = model.layers[-1]
    output_activation = _squashing_of(output_layer)
    if likelihood is None:
        likelihood = _SQUASHING.get(output_activation)
        if likelihood is None:
            raise ValueError(
                "bayesianize: pass likelihood= ('categorical', 'bernoulli', 'normal' or a "
                "bayes_keras.likelihoods object); the output layer has no softmax / sigmoid to infer it "
                "from."
            )
    elif output_activation is not None:
        # the squashing is dropped for the likelihood to apply to the particles' logits: only one that applies it
        squashes = type(likelihoods_lib.get(_SQUASHING[output_activation]))
        if type(likelihoods_lib.get(likelihood)) is not squashes:
            raise ValueError(
                f"bayesianize: the output layer '{output_layer.name}' applies "
                f"{output_activation.__name__}, which only the {_SQUASHING[output_activation]!r} "
                f"likelihood applies to the particles' logits; with likelihood={likelihood!r} the "
                "converted model would not compute what the Keras model computes. Leave likelihood= "
                f"out (it is {_SQUASHING[output_activation]!r}), or end the Keras model without "
                f"{output_activation.__name__}."
            )
    if batch_norm_momentum is not None and (
        not is_real(batch_norm_momentum) or not 0.0 <= batch_norm_momentum < 1.0
    ):
        raise ValueError(
            f"bayesianize: batch_norm_momentum must be a number in [0, 1) or None (each layer's own); "
            f"got {batch_norm_momentum!r}."
        )
    conversion = _Conversion(
        num_particles,
        kernel_prior,
        bias_prior,
        is_bayesian,
        output_layer,
        output_activation,
        batch_norm_momentum,
        lora_rank,
        lora_alpha,
    )
    conversion.head = ([layer for layer in _flat_layers(functional) if _has_twin(layer)] or [None])[
        -1
    ]
    clone = keras.models.clone_model(
        functional, clone_function=lambda layer: layer, call_function=conversion
    )
    bayesian = BayesianModel(
        clone.input, clone.outputs, likelihood=likelihood, name=f"bayesian_{model.name}"
    )
    if lora_rank is not None or conversion.adapted:
        _freeze_all_but_particles(bayesian)
    if conversion.shared:
        warnings.warn(
            f"bayesianize: {sorted(conversion.shared)} have no particle version and keep weights shared "
            f"by all particles (point estimates). {conversion_report(bayesian).summary()}; "
            "bayes_keras.conversion_report(model) lists every layer.",
            UserWarning,
            stacklevel=2,
        )
    if conversion.dropped:
        warnings.warn(
            "bayesianize: the particle layers' priors replace these regularizers / constraints, which "
            f"are dropped: {sorted(conversion.dropped)}.",
            UserWarning,
            stacklevel=2,
        )
    rng = np.random.default_rng(seed)
    for original, new in conversion.adapted:
        _place_lora(original, new, noise_std if center else None, int(rng.integers(2**31)))
    for weights, new in conversion.converted:
        if new.weights and center:
            # every weight, trainable or not (a frozen layer's are all non-trainable); statistics such as
            # BatchNormalization's moving averages are copied to every particle exactly, never jittered
            initialize_particles(
                [new], [v.numpy() for v in weights], noise_std, seed=int(rng.integers(2**31))
            )
    return bayesian


def _is_graph_model(layer):
    """A nested Sequential or functional model (its layer calls can be converted one by one)."""
    return isinstance(layer, (Functional, keras.Sequential))


def _nested_models(model):
    """The Sequential / functional models nested in `model`, at any depth."""
    for layer in model.layers:
        if _is_graph_model(layer):
            yield layer
            yield from _nested_models(layer)


def _flat_layers(model):
    """Every layer of `model` in call order, the layers of nested Sequential / functional models in their place
    (input layers left out)."""
    for layer in model.layers:
        if _is_graph_model(layer):
            yield from _flat_layers(layer)
        elif not isinstance(layer, _L.InputLayer):
            yield layer


def _is_weight_layer(layer):
    """A layer with a kernel and a particle version (Dense, convolutions, Embedding, recurrent layers, attention),
    or a custom layer with such sublayers."""
    return bool(layer.weights) and (
        _weight_twin(layer) is not None
        or type(layer) is _L.Bidirectional
        or _is_custom(layer)
        and bool(_custom_sublayers(layer))
    )


def _is_custom(layer):
    """A layer from outside Keras (a Python call over sublayers), not a graph model."""
    return (
        isinstance(layer, _L.Layer)
        and not type(layer).__module__.startswith(("keras.", "bayes_keras."))
        and not _is_graph_model(layer)
    )


def _custom_sublayers(layer, prefix=""):
    """(attribute path, sublayer) of the weight sublayers of a custom layer that have a particle twin: attributes
    holding Keras layers or lists of them ("att", "blocks.1"), Sequential sublayers whole, nested custom layers
    searched in turn."""
    found = []
    for name, value in vars(layer).items():
        if name == "_layers":  # Keras' own list of every tracked sublayer
            continue
        items = (
            [(name, value)]
            if isinstance(value, _L.Layer)
            else [(f"{name}.{i}", v) for i, v in enumerate(value) if isinstance(v, _L.Layer)]
            if isinstance(value, (list, tuple))
            else []
        )
        for path, sublayer in items:
            path = prefix + path
            if isinstance(sublayer, keras.Sequential) and any(
                _sublayer_twin(inner) for inner in sublayer.layers
            ):
                found.append((path, sublayer))
            elif _sublayer_twin(sublayer) is not None:
                found.append((path, sublayer))
            elif _is_custom(sublayer):
                found += _custom_sublayers(sublayer, path + ".")
    return found


def _sublayer_twin(layer):
    """The particle twin class of a Keras sublayer inside a custom layer, or None."""
    if type(layer) is _L.LayerNormalization:
        return (
            particle_layers.LayerNormalization if mixing_guard.axes_of(layer.axis) == [-1] else None
        )
    return _weight_twin(layer)


def _weight_twin(layer):
    """The particle twin of a Keras weight layer or of a subclass of one (keras.layers.ReversibleEmbedding,
    KerasHub's CachedMultiHeadAttention); a subclass is converted only if the twin computes what it does."""
    return next((_WEIGHT_TWINS[cls] for cls in type(layer).__mro__ if cls in _WEIGHT_TWINS), None)


def _copy_of(layer):
    """A fresh instance of a layer kept as it is, from its config (as keras.models.clone_model makes it)."""
    try:
        return layer.__class__.from_config(layer.get_config())
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"bayesianize: layer '{layer.name}' ({type(layer).__name__}) cannot be re-created from its "
            f"own get_config(), so no converted model (nor keras.models.clone_model, nor a .keras file "
            f"holding it) can: {str(error).splitlines()[-1][:300]} A frozen backbone called as one layer "
            "(`backbone(inputs)`) with nothing converted inside it is kept whole."
        ) from error


def _layout_twin(layer):
    """The particle twin of a Keras pooling, flattening or BatchNormalization layer, or of a BatchNormalization
    subclass (converted only if the twin computes what it does; any other subclass runs as it is, per particle)."""
    if isinstance(layer, _L.BatchNormalization):
        return particle_layers.BatchNormalization
    return _LAYOUT_TWINS.get(type(layer))


def _has_twin(layer):
    """Whether `layer` has weights and a particle version (the layers `bayesian=` can choose)."""
    return (
        _is_weight_layer(layer)
        or bool(layer.weights)
        and (_layout_twin(layer) is not None or type(layer) is _L.LayerNormalization)
    )


def _listed(names, limit=12):
    """A list of names for an error message, its middle elided when long (a backbone has hundreds of layers)."""
    names = list(names)
    if len(names) <= limit:
        return str(names)
    return (
        f"[{', '.join(map(repr, names[: limit // 2]))}, ... {', '.join(map(repr, names[-limit // 2 :]))}] "
        f"({len(names)} in all; bayes_keras.conversion_report lists every layer)"
    )


def _asked(chosen, what):
    """A user's callable layer -> bool, with an error that names the argument when it does not take a layer."""

    def asked(layer):
        try:
            return bool(chosen(layer))
        except TypeError as error:
            raise ValueError(
                f"bayesianize: {what} must be a callable that takes a keras layer and returns a bool; "
                f"calling it on layer '{layer.name}' failed: {error}"
            ) from error

    return asked


def _bayesian_selection(model, bayesian, deterministic):
    """layer -> whether its weights carry particles, from bayesianize's `bayesian=` and `deterministic=`.

    Default (bayesian=None): every trainable layer that has a particle version, except those `deterministic`
    names. Frozen layers (trainable=False) stay frozen point estimates unless `bayesian=` names them."""
    layers = list(_flat_layers(model))
    names = {layer.name for layer in layers}
    candidates = [layer for layer in layers if _has_twin(layer)]
    # a nested model's name stands for every layer in it (a backbone: deterministic=[backbone.name])
    nested = {
        layer.name: {inner.name for inner in _flat_layers(layer)} for layer in _nested_models(model)
    }

    def named(argument, what):
        if isinstance(argument, str):
            argument = [argument]
        try:
            argument = set(argument)
        except TypeError:
            forms = "a list of layer names or a callable layer -> bool" + (
                "" if what == "deterministic" else ", or an int k (the last k weight layers)"
            )
            raise ValueError(f"bayesianize: {what} must be {forms}; got {argument!r}.") from None
        unknown = sorted(str(n) for n in argument - names - set(nested))
        if unknown:
            raise ValueError(
                f"bayesianize: {what} names layers that '{model.name}' does not have: {unknown}. Its "
                f"layers with a particle version: {_listed(layer.name for layer in candidates)}."
            )
        return set().union(*(nested.get(name, {name}) for name in argument))

    if callable(deterministic):
        is_deterministic = _asked(deterministic, "deterministic")
    else:
        shared = named(deterministic, "deterministic")
        is_deterministic = lambda layer: layer.name in shared  # noqa: E731
    if bayesian is None:
        chosen = lambda layer: layer.trainable  # noqa: E731
    elif callable(bayesian):
        chosen = _asked(bayesian, "bayesian")
    elif isinstance(bayesian, (int, np.integer)) and not isinstance(bayesian, bool):
        weight_layers = [layer for layer in candidates if _is_weight_layer(layer)]
        if not 1 <= bayesian <= len(weight_layers):
            raise ValueError(
                f"bayesianize: bayesian={bayesian} asks for the last {bayesian} weight layers; "
                f"'{model.name}' has {len(weight_layers)} (Dense, convolution, embedding or recurrent "
                f"layers): give 1 to {len(weight_layers)}, a list of names or a callable."
            )
        # the last k weight layers and the normalization layers after the first of them
        first = candidates.index(weight_layers[-int(bayesian)])
        last = {id(layer) for layer in candidates[first:]}
        chosen = lambda layer: id(layer) in last  # noqa: E731
    else:
        picked = named(bayesian, "bayesian")
        direct = set([bayesian] if isinstance(bayesian, str) else bayesian) - set(nested)
        without_twin = sorted(
            layer.name for layer in layers if layer.name in direct and not _has_twin(layer)
        )
        if without_twin:
            raise ValueError(
                f"bayesianize: bayesian names layers without a particle version (or without weights): "
                f"{_listed(without_twin)}. Layers with one: "
                f"{_listed(layer.name for layer in candidates)}."
            )
        both = sorted(picked & (set() if callable(deterministic) else shared))
        if both:
            raise ValueError(
                f"bayesianize: {_listed(both)} are named both in bayesian= and deterministic=."
            )
        chosen = lambda layer: layer.name in picked  # noqa: E731

    def is_bayesian(layer):
        return _has_twin(layer) and bool(chosen(layer)) and not is_deterministic(layer)

    if not any(is_bayesian(layer) for layer in candidates):
        raise ValueError(
            f"bayesianize: no layer of '{model.name}' would carry particles (bayesian={bayesian!r}, "
            f"deterministic={deterministic!r}: deterministic= takes away what bayesian= chose, and "
            "frozen layers stay point estimates unless bayesian= names them). Layers with a particle "
            f"version: {_listed(layer.name for layer in candidates)}."
        )
    return is_bayesian


def _squashing_of(layer):
    """The output squashing a layer applies (softmax / sigmoid), as a keras.activations function."""
    if isinstance(layer, _L.Softmax) and layer.axis in (-1, [-1]):
        return keras.activations.softmax
    activation = getattr(layer, "activation", None)
    return activation if activation in _SQUASHING else None


def _particle_default_initializers(config):
    """Constant bias / beta / gamma initializers (Keras' zeros and ones) replaced by the particle layers' default,
    a small spread per particle: the converted weights are set from the Keras layer with a spread, but a clone
    built from the config (keras.models.clone_model, the scikit-learn wrappers) would otherwise start with
    identical particles there, which GPF's affine flow keeps identical."""
    constant = (keras.initializers.Zeros, keras.initializers.Ones)
    return {
        key: None
        for key in ("bias_initializer", "beta_initializer", "gamma_initializer")
        if config.get(key) is not None and isinstance(keras.initializers.get(config[key]), constant)
    }


class _Conversion:
    """The call function of keras.models.clone_model: converts each layer call of the Keras model."""

    def __init__(
        self,
        num_particles,
        kernel_prior,
        bias_prior,
        is_bayesian,
        output_layer,
        output_activation,
        batch_norm_momentum=None,
        lora_rank=None,
        lora_alpha=None,
    ):
        self.num_particles = num_particles
        self.lora_rank, self.lora_alpha = lora_rank, lora_alpha
        # the last weight layer: under LoRA it gets full particles (set by bayesianize)
        self.head = None
        self.adapted = []  # (Keras layer, LoRA twin): frozen weights copied, factors placed (_place_lora)
        self.batch_norm_momentum = batch_norm_momentum
        self.kernel_prior, self.bias_prior = kernel_prior, bias_prior
        self.is_bayesian = is_bayesian
        self.output_layer, self.output_activation = output_layer, output_activation
        self.carrying = set()  # ids of the new tensors that carry the particle axis
        self.converted = []  # (Keras weights, particle layer) pairs: its particles start at those weights
        self.shared = set()  # names of kept layers with weights that receive particles
        self.dropped = set()
        self.called = set()  # ids of the Keras layers converted so far

    def __call__(self, layer, *args, **kwargs):
        if isinstance(layer, _L.Layer):
            if id(layer) in self.called:
                raise ValueError(
                    f"bayesianize: layer '{layer.name}' ({type(layer).__name__}) is called more than "
                    "once (shared weights); bayesianize converts each layer call once. Use one layer "
                    "instance per call, or build the BayesianModel with bayes_keras layers."
                )
            self.called.add(id(layer))
        flat = [t for t in keras.tree.flatten((args, kwargs)) if isinstance(t, keras.KerasTensor)]
        carries = [id(t) in self.carrying for t in flat]
        has_particles = any(carries)
        if not isinstance(layer, _L.Layer):  # a keras.ops operation inside a functional model
            result = self._operation(layer, flat, carries, args, kwargs)
        elif _is_graph_model(layer) and (
            has_particles or any(map(self.is_bayesian, _flat_layers(layer)))
        ):
            result = self._inline(layer, args, kwargs)
        elif (
            layer is self.output_layer
            and self.output_activation
            and not hasattr(layer, "kernel")
            and isinstance(layer, (_L.Softmax, _L.Activation))
        ):
            return args[0]  # the likelihood squashes the particles' logits
        elif not has_particles and layer.weights and not self.is_bayesian(layer):
            # before the particle axis: a Keras layer, run once per example (frozen parts stay frozen)
            result = self._keep(layer, flat, carries, args, kwargs)
        elif _weight_twin(layer) is not None:
            result = self._twin(layer, _weight_twin(layer), has_particles, args, kwargs)
        elif type(layer) is _L.Bidirectional:
            result = self._bidirectional(layer, has_particles, args, kwargs)
        elif (
            type(layer) is _L.LayerNormalization
            and has_particles
            and _normalizes_last_axis(layer, flat)
        ):
            result = self._twin(layer, particle_layers.LayerNormalization, True, args, kwargs)
        elif _layout_twin(layer) is not None and has_particles:
            result = self._twin(layer, _layout_twin(layer), True, args, kwargs)
        elif _is_custom(layer) and self.is_bayesian(layer):
            result = self._custom(layer, flat, carries, args, kwargs)
        else:
            result = self._keep(layer, flat, carries, args, kwargs)
        if has_particles:
            self.carrying.update(id(t) for t in keras.tree.flatten(result))
        return result

    # -- nested models -------------------------------------------------------------------------
    def _inline(self, model, args, kwargs):
        """A nested Sequential or functional model with Bayesian layers (or after the particle axis): its layer
        calls are converted one by one in the outer graph. (A `training=` argument of the nested call is not
        passed on: Keras 3 does not apply it either; frozen BatchNormalization layers run in inference mode.)"""
        inputs = args[0] if len(args) == 1 else list(args)
        if isinstance(model, keras.Sequential):
            for layer in model.layers:
                inputs = self(layer, inputs)
            return inputs
        # Functional._run_through_graph (no public API runs a model's graph with a call function of ours)
        return model._run_through_graph(
            inputs, operation_fn=lambda operation: operation, call_fn=self
        )

    # -- operations ----------------------------------------------------------------------------
    def _operation(self, op, flat, carries, args, kwargs):
        merge = _MERGE_LAYERS.get(type(op).__name__)
        if (
            merge is not None
            and any(carries)
            and not all(carries)
            and len(flat) == 2
            and not kwargs
            and all(isinstance(a, keras.KerasTensor) for a in args)
        ):
            # `h + attention(h)` where h comes from before the particle axis (LoRA's frozen embeddings): the Keras
            # merge layer on each particle, h repeated for every particle
            return PerParticle(merge(), particle_inputs=carries)(list(args))
        if (
            type(op).__name__ == "GetItem"
            and carries
            and carries[0]
            and len(args) == 2
            and not kwargs
        ):
            key = encode_key(args[1])
            if key is not None:  # x[:, 0, :] of a (batch, T, F) tensor, on (batch, N, T, F)
                return particle_layers.GetItem(key, name=op.name)(args[0])
        if any(carries):
            problem = mixing_guard.operation_refusal(op, [tuple(t.shape) for t in flat], carries)
            if problem is not None:
                raise ValueError(f"bayesianize: {problem}.")
        # A new instance: called again, the original would hold nodes of both graphs, and readers of the clone's
        # graph (the mixing guard, export) would find the original model's tensors at its first node.
        return _recreated(op)(*args, **kwargs)

    # -- converted layers ----------------------------------------------------------------------
    def _twin_config(self, layer, twin):
        """`layer`'s constructor arguments that its particle twin takes; any other argument must be at its
        Keras default (regularizers and constraints are replaced by the prior)."""
        accepted = set(inspect.signature(twin.__init__).parameters)
        for base in twin.__mro__[1:]:
            if base is _L.Layer:
                break
            accepted |= set(inspect.signature(base.__init__).parameters)
        accepted |= {"name", "dtype", "trainable"} | (
            {"axis"} if twin is particle_layers.LayerNormalization else set()
        )
        defaults = {
            k: p.default for k, p in inspect.signature(type(layer).__init__).parameters.items()
        }
        config, kept = layer.get_config(), {}
        for key, value in config.items():
            if key in accepted:
                kept[key] = value
            elif any(word in key for word in _REPLACED_BY_PRIOR):
                if value is not None:
                    self.dropped.add(f"{layer.name}.{key}")
            elif (
                key in defaults and not _same(value, defaults[key]) and _RESOLVED.get(key) != value
            ):
                raise ValueError(
                    f"bayesianize: layer '{layer.name}' ({type(layer).__name__}) has {key}={value!r}, "
                    f"which {twin.__module__.split('.')[0]}.layers.{twin.__name__} does not support "
                    f"(only the default {defaults[key]!r})."
                )
        return kept

    def _lora(self, layer):
        """The rank of `layer`'s LoRA twin, or None when it converts as usual: a Bayesian Dense / EinsumDense /
        Embedding / attention layer under lora_rank (the output layer aside), or one Keras' enable_lora adapted."""
        if _keras_lora_rank(layer) is not None:
            return _keras_lora_rank(layer)
        if self.lora_rank is None or layer is self.head or not self.is_bayesian(layer):
            return None
        if not isinstance(layer, _LORA_TYPES):
            raise ValueError(
                f"bayesianize: lora_rank adapts Dense, EinsumDense, Embedding and MultiHeadAttention "
                f"layers; '{layer.name}' ({type(layer).__name__}) was chosen Bayesian. Choose the "
                "adapted layers with bayesian=."
            )
        return self.lora_rank

    def _lora_layer(self, layer, rank, starts):
        """`layer`'s Bayesian LoRA twin (not yet called): its weights frozen and shared, rank-`rank` factors per
        particle; `starts`: its input has no particle axis."""
        config = layer.get_config()
        alpha = (
            config.get("lora_alpha") if getattr(layer, "lora_enabled", False) else self.lora_alpha
        )
        common = dict(name=layer.name, dtype=config.get("dtype"), kernel_prior=self.kernel_prior)
        start = {"num_particles": self.num_particles} if starts else {}
        if isinstance(layer, _L.MultiHeadAttention):
            twin_config = self._twin_config(layer, particle_layers.MultiHeadAttention)
            enabled = [
                name
                for name, projection in zip(
                    ("query", "key", "value", "attention_output"), _projections_of(layer)
                )
                if getattr(projection, "lora_enabled", False)
            ]
            alpha = next(
                (p.lora_alpha for p in _projections_of(layer) if getattr(p, "lora_enabled", False)),
                alpha,
            )
            rank = next(
                (p.lora_rank for p in _projections_of(layer) if getattr(p, "lora_enabled", False)),
                rank,
            )
            return particle_layers.MultiHeadAttention(
                **twin_config,
                lora_rank=rank,
                lora_alpha=alpha,
                lora_projections=enabled or ("query", "value"),
                kernel_prior=self.kernel_prior,
                bias_prior=self.bias_prior,
                **start,
            )
        if isinstance(layer, _L.Embedding):
            return particle_layers.LoRAEmbedding(
                layer.input_dim,
                layer.output_dim,
                rank=rank,
                lora_alpha=alpha,
                mask_zero=layer.mask_zero,
                num_particles=self.num_particles,
                **common,
            )
        if isinstance(layer, _L.Dense):
            equation, output_shape, bias_axes = (
                "...b,bc->...c",
                layer.units,
                "c" if layer.use_bias else None,
            )
        else:
            equation, output_shape, bias_axes = (
                layer.equation,
                layer.partial_output_shape,
                layer.bias_axes,
            )
        return particle_layers.LoRAEinsumDense(
            equation,
            output_shape,
            rank=rank,
            lora_alpha=alpha,
            activation=config.get("activation"),
            bias_axes=bias_axes,
            **common,
            **start,
        )

    def _lora_twin(self, layer, rank, has_particles, args, kwargs):
        new = self._lora_layer(layer, rank, starts=not has_particles)
        try:
            result = new(*args, **_accepted_kwargs(layer, new, kwargs))
        except ValueError as error:
            raise ValueError(
                f"bayesianize: layer '{layer.name}' ({type(layer).__name__}) cannot be adapted with "
                f"LoRA: {error}"
            ) from error
        if len(keras.tree.flatten(result)[0].shape) == IMAGE_RANK:
            raise ValueError(
                f"bayesianize: layer '{layer.name}' ({type(layer).__name__}) has a rank-4 output, which "
                "with the particle axis would read as particle images; LoRA adapts layers of "
                "(batch, [time,] features) inputs."
            )
        self.adapted += _lora_pairs(layer, new)
        self.carrying.update(id(t) for t in keras.tree.flatten(result))
        return result

    def _twin(self, layer, twin, has_particles, args, kwargs):
        rank = self._lora(layer)
        if rank is not None:
            return self._lora_twin(layer, rank, has_particles, args, kwargs)
        config = self._twin_config(layer, twin)
        if twin is particle_layers.LayerNormalization:
            config["axis"] = -1  # converted only when it normalises the last axis
        if twin is particle_layers.BatchNormalization:
            config["axis"] = self._particle_layout_axis(layer.axis, keras.tree.flatten(args)[0])
        if layer is self.output_layer and self.output_activation:
            config["activation"] = None
        particle_twin = issubclass(twin, ParticleLayer) or issubclass(twin, _COMPOSITE_TWINS)
        if layer.weights and particle_twin:
            bayesian = bool(self.is_bayesian(layer))
            config.update(
                deterministic=not bayesian,
                kernel_prior=self.kernel_prior,
                bias_prior=self.bias_prior,
            )
            if bayesian:
                # chosen Bayesian: its particles train, even if the layer was frozen
                config["trainable"] = True
                config.update(_particle_default_initializers(config))
        if particle_twin and not has_particles:
            # before the particle axis: a Keras layer
            if twin is particle_layers.BatchNormalization:
                return self._keep(layer, [], [], args, kwargs)
            config["num_particles"] = self.num_particles
        if twin is particle_layers.BatchNormalization and self.batch_norm_momentum is not None:
            config["momentum"] = float(self.batch_norm_momentum)
        try:
            new = twin(**config)
            if type(layer) not in _TWINNED and particle_twin:  # a subclass: its call may differ
                flat = [
                    t
                    for t in keras.tree.flatten((args, kwargs))
                    if isinstance(t, keras.KerasTensor)
                ]
                problem = _per_particle_mismatch(
                    layer,
                    new,
                    [(layer, new, "full")],
                    flat,
                    [id(t) in self.carrying for t in flat],
                    args,
                    _accepted_kwargs(layer, new, kwargs),
                    self.num_particles,
                )
                if problem is not None and twin is particle_layers.BatchNormalization:
                    raise ValueError(
                        f"its call differs from BatchNormalization's on particle activations: {problem}; "
                        "kept as it is, its batch statistics would mix the particles. Apply it before "
                        "the first weight layer, or build the BayesianModel by hand."
                    )
                if problem is not None:
                    warnings.warn(
                        f"bayesianize: layer '{layer.name}' ({type(layer).__name__}) subclasses "
                        f"{[c.__name__ for c in type(layer).__mro__ if c in _TWINNED][0]}, but as "
                        f"bayes_keras.layers.{twin.__name__} {problem}; it stays a shared point estimate.",
                        UserWarning,
                        stacklevel=4,
                    )
                    return self._keep(
                        layer, flat, [id(t) in self.carrying for t in flat], args, kwargs
                    )
            result = new(*args, **_accepted_kwargs(layer, new, kwargs))
        except ValueError as error:
            raise ValueError(
                f"bayesianize: layer '{layer.name}' ({type(layer).__name__}) cannot be converted to "
                f"bayes_keras.layers.{twin.__name__}: {error}"
            ) from error
        if twin is particle_layers.EinsumDense and len(result.shape) == IMAGE_RANK:
            raise ValueError(
                f"bayesianize: layer '{layer.name}' (EinsumDense) has a rank-4 output, which with the "
                "particle axis would read as particle images (batch, H, W, particles, channels) in the "
                "layers after it; only MultiHeadAttention uses such projections inside."
            )
        if issubclass(twin, ParticleLayer):
            self.converted.append((layer.weights, new))
        elif issubclass(twin, _COMPOSITE_TWINS):
            self.converted.extend(_sublayer_weights(layer, new))
        self.carrying.update(id(t) for t in keras.tree.flatten(result))
        return result

    def _bidirectional(self, layer, has_particles, args, kwargs):
        if layer.merge_mode is None:
            raise ValueError(
                f"bayesianize: layer '{layer.name}' is a Bidirectional with merge_mode=None (two "
                "outputs); a BayesianModel has one output: use 'concat', 'sum', 'ave' or 'mul'."
            )
        directions = []
        for inner in (layer.forward_layer, layer.backward_layer):
            twin = _WEIGHT_TWINS.get(type(inner))
            if twin is None:
                raise ValueError(
                    f"bayesianize: layer '{layer.name}' wraps {type(inner).__name__}; "
                    "bayes_keras.layers.Bidirectional wraps SimpleRNN, LSTM and GRU."
                )
            config = self._twin_config(inner, twin)
            bayesian = bool(self.is_bayesian(layer))
            config.update(
                deterministic=not bayesian,
                kernel_prior=self.kernel_prior,
                bias_prior=self.bias_prior,
                trainable=bayesian or layer.trainable,
            )
            if not has_particles:
                config["num_particles"] = self.num_particles
            directions.append(twin(**config))
        forward, backward = directions
        if forward.go_backwards:  # Keras' Bidirectional can be given a backward first
            forward, backward = backward, forward
        new = particle_layers.Bidirectional(
            forward, merge_mode=layer.merge_mode, backward_layer=backward, name=layer.name
        )
        result = new(*args, **_accepted_kwargs(layer, new, kwargs))
        self.converted.append((layer.forward_layer.weights, new.forward_layer))
        self.converted.append((layer.backward_layer.weights, new.backward_layer))
        self.carrying.update(id(t) for t in keras.tree.flatten(result))
        return result

    # -- custom layers -------------------------------------------------------------------------
    def _sublayer_twin_of(self, sublayer, bayesian, starts, adapted=(_L.MultiHeadAttention,)):
        """A particle twin of a Keras sublayer of a custom layer, its particles set to the sublayer's weights, and
        the (Keras weights, particle layer) pairs that place its particles. Under LoRA, sublayers of the `adapted`
        types get factors."""
        if isinstance(sublayer, keras.Sequential):
            inner = [
                self._sublayer_twin_of(layer, bayesian, starts and i == 0, adapted)
                if _sublayer_twin(layer)
                else (_copy_of(layer), [])
                for i, layer in enumerate(sublayer.layers)
            ]
            return keras.Sequential([t for t, _ in inner], name=sublayer.name), [
                p for _, ps in inner for p in ps
            ]
        twin = _sublayer_twin(sublayer)
        lora = _keras_lora_rank(sublayer) or (
            self.lora_rank if isinstance(sublayer, adapted) else None
        )
        # under LoRA, a custom layer's attention is adapted; the rest frozen
        if bayesian and lora is not None:
            new = self._lora_layer(sublayer, lora, starts or isinstance(sublayer, _L.Embedding))
            return new, [(sublayer, new, "lora")]
        if self.lora_rank is not None:
            bayesian = False
        config = self._twin_config(sublayer, twin)
        config.update(
            deterministic=not bayesian, kernel_prior=self.kernel_prior, bias_prior=self.bias_prior
        )
        if self.lora_rank is not None:
            config["trainable"] = False
        if bayesian:
            config["trainable"] = True
            config.update(_particle_default_initializers(config))
        if twin is particle_layers.LayerNormalization:
            config["axis"] = -1
        if starts or twin is particle_layers.Embedding:  # token ids have no particle axis
            config["num_particles"] = self.num_particles
        new = twin(**config)
        return new, [(sublayer, new, "full")]

    def _custom(self, layer, flat, carries, args, kwargs):
        """A custom layer with weight sublayers that have twins: `particle_layers.Converted` around a fresh copy whose
        sublayers are the twins, accepted when each particle computes what the layer computes on that particle's
        input (checked on random inputs); when it does not, the same folded (the layer's own operations see every
        particle as an example, for layers that read the particle axis as one of theirs: a causal mask from axis 1);
        otherwise the layer is kept, and its weights are named as shared."""
        bayesian = bool(self.is_bayesian(layer))
        batchless = _batchless_paths(layer)
        # Floating-point inputs without the particle axis are repeated for every particle (activations that the
        # call adds to particle activations), unless that fails the check (floating-point token ids).
        floats = [not c and not _is_integer(t) for t, c in zip(flat, carries)]
        attempts = [(True, False), (False, False)] if any(floats) else [(False, False)]
        sublayers = _custom_sublayers(layer)
        # under LoRA a selected custom layer's attention is adapted; one without attention, its weight layers (as a
        # model without attention is)
        has_attention = any(
            isinstance(s, _L.MultiHeadAttention)
            or isinstance(s, keras.Sequential)
            and any(isinstance(inner, _L.MultiHeadAttention) for inner in s.layers)
            for _, s in sublayers
        )
        adapted = (
            (_L.MultiHeadAttention,) if has_attention else (_L.Dense, _L.EinsumDense, _L.Embedding)
        )
        for repeat, folded in attempts + [(False, True)]:
            copy = _copy_of(layer)
            built_parts = _made_in_build(layer, copy)
            twins, pairs = {}, []
            for path, sublayer in sublayers:
                twin, placed = self._sublayer_twin_of(
                    sublayer, bayesian, path in batchless, adapted
                )
                twins[path] = (
                    particle_layers.Batchless(twin, name=f"{twin.name}_batchless")
                    if path in batchless
                    else twin
                )
                pairs += placed
            particle_inputs = [
                True if c else (False if f and repeat else None) for c, f in zip(carries, floats)
            ]
            new = particle_layers.Converted(
                copy,
                twins,
                particle_inputs,
                self.num_particles,
                name=layer.name,
                trainable=layer.trainable or bayesian,
                built_parts=built_parts,
                folded=folded,
            )
            problem = _per_particle_mismatch(
                layer, new, pairs, flat, carries, args, kwargs, self.num_particles
            )
            if problem is None:
                break
        if problem is not None:
            warnings.warn(
                f"bayesianize: the sublayers of custom layer '{layer.name}' ({type(layer).__name__}) stay "
                f"shared by all particles: with particle twins, {problem}.",
                UserWarning,
                stacklevel=4,
            )
            return self._keep(layer, flat, carries, args, kwargs)
        result = new(*args, **kwargs)
        kept = [
            v.path for v in layer.weights if not any(v is w for s, _, _ in pairs for w in s.weights)
        ]
        if kept:  # weights of the custom layer itself, or of sublayers without a twin
            self.shared.add(f"{layer.name} ({', '.join(kept)})")
        for original, twin, kind in pairs:
            if kind == "lora":
                self.adapted += _lora_pairs(original, twin)
            else:
                self.converted.extend(
                    _sublayer_weights(original, twin)
                    if isinstance(twin, _COMPOSITE_TWINS)
                    else [(original.weights, twin)]
                )
        self.carrying.update(id(t) for t in keras.tree.flatten(result))
        return result

    def _particle_layout_axis(self, axis, tensor):
        """A Keras layer's axis argument in the particle layout: -1 where it denotes the Keras input's last
        axis (BatchNormalization(axis=3) on images), else unchanged (which the twin then refuses)."""
        rank = len(tensor.shape) - (id(tensor) in self.carrying)  # the Keras model's rank
        axes = mixing_guard.axes_of(axis)
        return -1 if axes and all(a % rank == rank - 1 for a in axes) else axis

    # -- kept layers ---------------------------------------------------------------------------
    def _keep(self, layer, flat, carries, args, kwargs):
        # the same draws on one device, and under tf.distribute those one device makes (layers/_random.py)
        new = _random_twin(layer, flat[0], carries[0]) if len(flat) == 1 else None
        # its config holds the function's bytecode: share it
        if new is None and isinstance(layer, _L.Lambda):
            new = _L.Lambda(layer.function, arguments=layer.arguments, name=layer.name)
        elif new is None:
            new = _copy_of(layer)
            if not layer.trainable:
                # A nested model's config holds its layers' flags but not its own: a frozen backbone came back
                # trainable with frozen layers, and `backbone.trainable = True` then changed nothing.
                new.trainable = False
        if any(carries):
            self._check_per_example(layer, flat, carries)
            if not (
                isinstance(new, _RANDOM_TWINS)
                or self._acts_per_particle_as_is(layer, flat, carries)
            ):
                new = PerParticle(
                    new, particle_inputs=None if all(carries) else carries, name=layer.name
                )
            elif isinstance(
                layer, mixing_guard.AXIS_ARGUMENT + (_L.Normalization,)
            ) and layer.axis not in (-1, [-1]):
                # its axis is the last in the Keras model (Concatenate(axis=3) of images); in the particle layout
                # that index is the particle axis: the last axis is -1 in both
                config = layer.get_config()
                config["axis"] = -1 if isinstance(config["axis"], int) else [-1]
                new = layer.__class__.from_config(config)
            if layer.weights:
                self.shared.add(layer.name)
        if isinstance(new, PerParticle):
            only_tensors = all(isinstance(t, keras.KerasTensor) for t in keras.tree.flatten(args))
            if len(args) > 1 and only_tensors:  # layer(query, value): one list, unpacked
                new = PerParticle(
                    new.layer, particle_inputs=new.particle_inputs, unpack=True, name=layer.name
                )
                args = (list(args),)
            elif not only_tensors or any(
                isinstance(t, keras.KerasTensor) for t in keras.tree.flatten(kwargs)
            ):
                raise ValueError(
                    f"bayesianize: layer '{layer.name}' ({type(layer).__name__}) is called with "
                    "tensor keyword arguments or non-tensor positional arguments next to particle "
                    "activations, which bayesianize cannot pass through; call it with tensors only."
                )
        result = new(*args, **kwargs)
        target = new.layer if isinstance(new, PerParticle) else new
        if not layer.trainable:
            # again, now that it is built, so that sublayers made in build() (KerasHub's) freeze too
            freeze(target)
        _copy_state(layer, target)
        return result

    def _check_per_example(self, layer, flat, carries):
        """Refuse layers that cannot act on each particle as on an ordinary batch (checked on the shapes the Keras
        layer takes: PerParticle folds the particle axis into the batch)."""
        name = f"bayesianize: layer '{layer.name}' ({type(layer).__name__})"
        if isinstance(layer, _L.BatchNormalization):
            raise ValueError(
                f"{name}: bayes_keras.layers.BatchNormalization normalises the last axis only; this "
                f"one has axis={layer.axis}."
            )
        if isinstance(layer, _L.Masking):
            raise ValueError(
                f"{name}: masking after the first weight layer would give each particle its own mask; "
                "mask the inputs (Masking or Embedding(mask_zero=True) before the first weight layer)."
            )
        if getattr(layer, "stateful", False):
            raise ValueError(
                f"{name}: stateful layers carry state from batch to batch, which particles cannot "
                "share; use stateful=False."
            )
        if type(layer).__module__.startswith("keras.") and not isinstance(layer, _L.Lambda):
            return  # Keras' layers treat the examples of a batch independently (BatchNormalization aside)
        shapes = [
            tuple(t.shape[: particle_axis(len(t.shape))])
            + tuple(t.shape[particle_axis(len(t.shape)) + 1 :])
            if c
            else tuple(t.shape)
            for t, c in zip(flat, carries)
        ]
        if not _treats_examples_independently(layer, shapes):
            raise ValueError(
                f"{name} receives particle activations and is a Lambda or not a Keras layer, and bayes_keras could not confirm "
                "that it treats the examples of a batch independently (its input shapes are not concrete, or one "
                "example's output moved when another's input did). Apply it before the first weight layer, or "
                "build the BayesianModel by hand with bayes_keras.layers.PerParticle around it."
            )

    @staticmethod
    def _acts_per_particle_as_is(layer, flat, carries):
        """A kept layer that acts per element or on the last axis needs no folding of the particle axis."""
        if not all(carries) or len({len(t.shape) for t in flat}) != 1:
            return False
        if any(get_keras_mask(t) is not None for t in flat) and isinstance(
            layer, mixing_guard.MERGES + (_L.Concatenate,)
        ):
            return False  # Keras' merges apply (batch, T) masks to (batch, T, F) inputs: fold the particles first
        if type(layer) in mixing_guard.REPLACEMENTS:
            return False
        rank = len(flat[0].shape) - 1  # the Keras model's rank (the particle layout adds an axis)
        if isinstance(layer, mixing_guard.AXIS_ARGUMENT + (_L.Normalization,)):
            return all(a % rank == rank - 1 for a in mixing_guard.axes_of(layer.axis))
        if isinstance(layer, (_L.Dropout,)) and layer.noise_shape is not None:
            return False
        if isinstance(layer, _L.PReLU):
            return False  # its alpha has the input's shape
        return isinstance(layer, mixing_guard.PER_ELEMENT + mixing_guard.MERGES)


_RANDOM_TWINS = (
    particle_layers.Dropout,
    particle_layers.AlphaDropout,
    particle_layers.GaussianNoise,
    particle_layers.GaussianDropout,
)
_SPATIAL_DROPOUT = (_L.SpatialDropout1D, _L.SpatialDropout2D, _L.SpatialDropout3D)


def _random_twin(layer, tensor, carries):
    """bayes_keras' twin of a Keras random layer (Dropout, SpatialDropout1D/2D/3D, AlphaDropout, GaussianNoise,
    GaussianDropout; exact types) on `tensor`, or None. A noise shape is given in the particle layout: with an
    entry for the particle axis (each particle its own mask) when `tensor` carries one, so a SpatialDropout2D
    becomes a Dropout with noise shape (batch, 1, 1, N, C) on (batch, H, W, N, C)."""
    kind = type(layer)
    if kind in (_L.GaussianNoise, _L.GaussianDropout):
        return getattr(particle_layers, kind.__name__).from_config(layer.get_config())
    if kind not in (_L.Dropout, _L.AlphaDropout) + _SPATIAL_DROPOUT:
        return None
    config = layer.get_config()
    rank = len(tensor.shape) - bool(carries)  # in the Keras model
    if kind in _SPATIAL_DROPOUT:
        spatial = [1] * (rank - 2)
        noise_shape = [None] + (
            spatial + [None]
            if config.pop("data_format", "channels_last") == "channels_last"
            else [None] + spatial
        )
    else:
        noise_shape = config.pop("noise_shape", None)
    if noise_shape is not None:
        if len(noise_shape) != rank:
            return None  # Keras refuses it when called
        noise_shape = list(noise_shape)
        if carries:
            noise_shape.insert(particle_axis(rank + 1), None)
        noise_shape = tuple(noise_shape)
    twin = particle_layers.AlphaDropout if kind is _L.AlphaDropout else particle_layers.Dropout
    return twin.from_config(dict(config, noise_shape=noise_shape))


def _recreated(op):
    """A fresh instance of a keras.ops operation from its config (the operation itself if it has none)."""
    try:
        config = op.get_config()
    except NotImplementedError:
        return op
    return type(op).from_config(config)


def _normalizes_last_axis(layer, flat):
    rank = len(flat[0].shape) - 1  # in the Keras model (flat carry the particle axis)
    return all(a % rank == rank - 1 for a in mixing_guard.axes_of(layer.axis))


def _same(value, default):
    if default is inspect.Parameter.empty:
        return False
    try:
        return bool(value == default) or (isinstance(default, tuple) and list(default) == value)
    except (TypeError, ValueError):
        return False


def _keras_lora_rank(layer):
    """The rank of Keras' enable_lora on `layer` (on an attention layer: on one of its projections), or None."""
    if isinstance(layer, _L.MultiHeadAttention) and layer.built:
        return next(
            (
                p.lora_rank
                for p in (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)
                if getattr(p, "lora_enabled", False)
            ),
            None,
        )
    return layer.lora_rank if getattr(layer, "lora_enabled", False) else None


def _freeze_all_but_particles(model):
    """Under LoRA: every layer whose weights carry no particles is frozen (the pretrained weights stay as they
    are; only the factors and the head's particles train)."""
    for layer in model.layers:
        if layer.weights and not any(
            getattr(v, "is_particle_variable", False) for v in layer.weights
        ):
            # (setting the value a layer has does not reach sublayers made in build())
            layer.trainable = True
            layer.trainable = False


def _made_in_build(original, copy):
    """What a custom layer makes in build() (KerasHub's TransformerEncoder makes its sublayers there), which a
    fresh copy from its config lacks: {attribute: fresh sublayer, or a plain value}. Empty when __init__ makes
    everything. With them the copy is complete without being built (its build would re-make the sublayers and
    overwrite the twins)."""
    parts = {}
    for name, value in vars(original).items():
        if (
            name in vars(copy)
            or name == "_layers"
            or name.startswith("_self_")
            and not isinstance(value, _L.Layer)
        ):
            continue  # TensorFlow's own tracking attributes (_self_update_uid, ...)
        if isinstance(value, _L.Layer):
            parts[name] = value.__class__.from_config(value.get_config())
        elif isinstance(value, (bool, int, float, str, type(None))):
            parts[name] = value
    return parts


def _default_lora_layers(model):
    """bayesianize's default Bayesian layers under LoRA: the attention layers (custom layers holding attention
    count as attention), or every Dense / EinsumDense / Embedding of a model without attention; and the output
    layer (a new head has no pretrained weights to adapt: it gets full particles)."""
    layers = list(_flat_layers(model))

    def has_attention(layer):
        return (
            isinstance(layer, _L.MultiHeadAttention)
            or _is_custom(layer)
            and any(
                isinstance(sublayer, _L.MultiHeadAttention)
                for _, sublayer in _custom_sublayers(layer)
            )
        )

    chosen = [layer for layer in layers if has_attention(layer)] or [
        layer
        for layer in layers
        if isinstance(layer, _LORA_TYPES) and not isinstance(layer, _L.MultiHeadAttention)
    ]
    # frozen or not: LoRA adapts frozen weights (a backbone frozen for fine-tuning a head gets adapters too)
    head = [layer for layer in layers if _has_twin(layer)][
        -1:
    ]  # the last weight layer (a softmax may follow)
    return [layer.name for layer in chosen] + [layer.name for layer in head if layer not in chosen]


def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _place_lora(original, new, noise_std, seed, noise_floor=0.01):
    """A LoRA twin's frozen weights from the Keras layer, exactly; its factors from the Keras layer's own
    (enable_lora) plus the jitter (`initialize_particles`), or, without them, A as drawn per particle and B
    (Keras' zeros) jittered: N(0, (noise_std * noise_floor)^2) per entry, so that noise_std=0 is exact."""
    arrays = [
        v.numpy() for v in original.weights
    ]  # a LoRA-enabled Keras layer: kernel, [bias,] A, B
    factors = arrays[-2:] if getattr(original, "lora_enabled", False) else None
    base = arrays[:-2] if factors else arrays
    for variable, value in zip(
        [v for v in new.weights if not getattr(v, "is_particle_variable", False)], base
    ):
        variable.assign(value)
    if noise_std is None:
        return
    if factors is not None:
        initialize_particles([new], factors, noise_std, seed=seed, noise_floor=noise_floor)
        return
    rng = np.random.default_rng(seed)
    for variable in [v for v in new.weights if getattr(v, "is_particle_variable", False)][
        1::2
    ]:  # each B
        variable.assign(
            (noise_std * noise_floor * rng.standard_normal(variable.shape)).astype(variable.dtype)
        )


def _is_integer(tensor):
    return "int" in str(getattr(tensor, "dtype", ""))


class _Recorder(_L.Layer):
    """Stands in for a sublayer while a custom layer is traced: records the shape of its first input."""

    def __init__(self, layer):
        super().__init__(name=f"{layer.name}_recorder")
        self.layer, self.shapes = layer, []

    def build(self, *args, **kwargs):
        pass  # the recorded layer builds on its call

    def call(self, *args, **kwargs):
        self.shapes.append(tuple(keras.tree.flatten(args)[0].shape))
        return self.layer(*args, **kwargs)


def _batchless_paths(layer):
    """Paths of a custom layer's sublayers called on tensors without a batch axis (`ops.arange(maxlen)`), found by
    tracing a fresh copy on symbolic inputs of the layer's input shapes: their first axis is known."""
    try:
        probe = layer.__class__.from_config(layer.get_config())
        recorders = {}
        for path, _ in _custom_sublayers(probe):
            recorders[path] = _Recorder(get_sublayer(probe, path))
            set_sublayer(probe, path, recorders[path])
        inputs = keras.tree.map_structure(
            lambda t: keras.KerasTensor(t.shape, t.dtype), layer.input
        )
        probe(*inputs) if isinstance(inputs, (list, tuple)) else probe(inputs)
    except Exception:  # noqa: BLE001 - then nothing is batchless; the per-particle check still runs
        return set()
    return {
        path
        for path, r in recorders.items()
        if r.shapes and len(r.shapes[0]) and r.shapes[0][0] is not None
    }


def _per_particle_mismatch(original, new, pairs, flat, carries, args, kwargs, num_particles):
    """Why `new` (a Converted custom layer, its twins set to the Keras sublayers' weights) does not compute, for every
    particle, what `original` computes on that particle's input, on random inputs; None when it does."""
    rng = np.random.default_rng(0)
    concrete = []
    for tensor, carries_particles in zip(flat, carries):
        shape = [2] + [
            mixing_guard.probe_length(num_particles) if d is None else d
            for d in tensor.shape[1 + carries_particles :]
        ]
        # in [0, 2): valid token ids of any table once cast to integers, as the Keras Embedding does
        value = rng.integers(0, 2, shape) if _is_integer(tensor) else rng.uniform(0.0, 1.5, shape)
        value = value.astype(str(tensor.dtype))
        if carries_particles:  # a different input for every particle
            value = np.stack(
                [value + 0.4 * n / num_particles for n in range(num_particles)],
                particle_axis(len(shape) + 1),
            )
        concrete.append(value)
    replace = dict(zip(map(id, flat), concrete))

    def bound(structure, particle=None):
        def one(x):
            if id(x) not in replace:
                return x
            value = replace[id(x)]
            carried = carries[[id(t) for t in flat].index(id(x))]
            if particle is None or not carried:
                return value
            return np.take(value, particle, axis=particle_axis(value.ndim))

        return keras.tree.map_structure(one, structure)

    drawn = []  # LoRA factors drawn by the twins (B near zero): zero during the check, then restored
    try:
        with warnings.catch_warnings():  # Keras' notes on building the custom layer's copy
            warnings.simplefilter("ignore")
            # builds the twins, whose weights are then set to the sublayers'
            new(*bound(args), **bound(kwargs))
        for sublayer, twin, kind in pairs:
            if kind == "lora":
                for keras_layer, target in _lora_pairs(sublayer, twin):
                    _place_lora(keras_layer, target, 0.0, 0)
                    if _keras_lora_rank(keras_layer) is None:
                        drawn += [
                            (v, v.numpy())
                            for v in target.weights
                            if getattr(v, "is_particle_variable", False)
                            and "_b" in v.path.rsplit("/", 1)[-1]
                        ]
                continue
            for weights, target in (
                _sublayer_weights(sublayer, twin)
                if isinstance(twin, _COMPOSITE_TWINS)
                else [(sublayer.weights, twin)]
            ):
                initialize_particles([target], [v.numpy() for v in weights], noise_std=0.0)
        for variable, _ in drawn:
            variable.assign(np.zeros(variable.shape, variable.dtype))
        got = keras.tree.flatten(new(*bound(args), **bound(kwargs)))
        for n in range(num_particles):
            expected = keras.tree.flatten(original(*bound(args, n), **bound(kwargs, n)))
            for g, e in zip(got, expected):
                g = np.take(np.asarray(g), n, axis=particle_axis(np.ndim(g)))
                e = np.asarray(e)
                if g.shape != e.shape or not np.allclose(
                    g, e, atol=1e-4 * (1.0 + np.max(np.abs(e), initial=0.0))
                ):
                    return (
                        f"particle {n}'s output is not the layer's output on that particle's input (shapes "
                        f"{g.shape} and {e.shape}): its call mixes particles or drops the particle axis, or a "
                        "sublayer computes other than its particle twin"
                    )
    except Exception as error:  # noqa: BLE001 - any failure means the twins cannot stand in for the sublayers
        return f"its call fails ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    finally:
        for variable, value in drawn:
            variable.assign(value)
    return None


def _lora_pairs(layer, new):
    """(Keras layer, twin) pairs whose weights `_place_lora` places: an attention layer's projections, one by one."""
    if isinstance(new, _COMPOSITE_TWINS):
        return list(zip(_projections_of(layer), new.projections))
    return [(layer, new)]


def _projections_of(attention):
    """A Keras MultiHeadAttention's projections in the order of its weights (query, key, [gate,] value, output),
    found by their weights: the gate has no public name."""
    named = [
        attention.query_dense,
        attention.key_dense,
        attention.value_dense,
        attention.output_dense,
    ]
    ids = {id(v) for layer in named for v in layer.weights}
    gate = [v for v in attention.weights if id(v) not in ids]
    if gate:
        raise ValueError(
            f"bayesianize: LoRA on '{attention.name}', an attention layer with use_gate=True, is not "
            "supported; adapt its other layers with bayesian=."
        )
    return [
        attention.query_dense,
        attention.key_dense,
        attention.value_dense,
        attention.output_dense,
    ]


def _sublayer_weights(original, new):
    """(the Keras layer's weights of each sublayer, the twin's particle sublayer): the twin builds its sublayers in
    Keras' order, so its weights list as the original's do and split by the sublayers' weight counts."""
    weights, pairs = list(original.weights), []
    for sublayer in new.projections:
        count = len(sublayer.weights)
        pairs.append((weights[:count], sublayer))
        weights = weights[count:]
    if weights:
        raise ValueError(
            f"bayesianize: layer '{original.name}' has weights its twin does not: "
            f"{[v.path for v in weights]}."
        )
    return pairs


def _accepted_kwargs(layer, new, kwargs):
    accepted = inspect.signature(new.call).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return kwargs
    dropped = {k: v for k, v in kwargs.items() if k not in accepted and k != "training"}
    if any(v is not None for v in dropped.values()):
        raise ValueError(
            f"bayesianize: layer '{layer.name}' is called with {sorted(dropped)}, which "
            f"{type(new).__name__} does not take."
        )
    return {k: v for k, v in kwargs.items() if k not in dropped}


def _copy_state(original, new):
    """Every weight of `original` (trainable or not) into `new`, then the state preprocessing layers derive
    from their weights (Normalization's mean and variance after adapt)."""
    values = original.get_weights()
    if values:
        new.set_weights(values)
        if hasattr(new, "finalize_state"):
            new.finalize_state()


def _treats_examples_independently(layer, shapes):
    """Run `layer` on random inputs of `shapes` with batch 3, then with example 0 changed; True when examples 1
    and 2 are bit-identical (a check on one draw, not a proof)."""

    def first_example_moved(values):
        for v in values:
            v[:1] += 1.0
        return values

    outputs = mixing_guard.perturbed_outputs(
        layer, shapes, ["float32"] * len(shapes), 3, first_example_moved
    )
    return outputs is not None and all(
        a.shape[:1] == (3,) and np.array_equal(a[1:], b[1:]) for a, b in zip(*outputs)
    )
