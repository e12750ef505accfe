"""Which plain Keras layers may receive particle activations: declared rules per layer family, and a check.

A plain Keras layer placed after a particle layer sees (batch, N, ...) activations, or particle images
(batch, H, W, N, C). It is accepted only when it acts on each particle separately, decided by what it
does to the particle axis, not by its name:

- per-element layers and layers of the last axis (activations, dropout and noise, Dense as a shared
  head, Add / Multiply / ... over particle tensors of one layout, Rescaling, Normalization) act per
  particle on any layout;
- layers with an axis argument (Softmax, LayerNormalization, UnitNormalization, RMSNormalization,
  Concatenate) act per
  particle when no axis is the batch or the particle axis, read from their arguments;
- bayes_keras' own layers and `bayes_keras.layers.PerParticle` know the layout;
- everything else (layers that read axis 1 as space or time, pool or attend over it, reshape it,
  batch normalization, custom layers) is refused, naming the layer and what to use instead (its
  bayes_keras version, or `PerParticle(layer)`, which applies a per-example layer to each particle).

An accepted layer whose input shapes are concrete is also checked once when the model is built: the
first particle of its inputs is perturbed and every other particle's output must stay bit-identical.
"""

import keras
import numpy as np

from bayes_keras.layers.particle_layout import particle_axis

_L = keras.layers

# Act on each element, or on the last axis alone: they cannot couple particles on any layout.
PER_ELEMENT = (
    _L.Activation,
    _L.ReLU,
    _L.LeakyReLU,
    _L.ELU,
    _L.PReLU,
    _L.Dropout,
    _L.GaussianNoise,
    _L.GaussianDropout,
    _L.AlphaDropout,
    _L.Identity,
    _L.Rescaling,
    _L.ActivityRegularization,
    _L.Dense,
    _L.Normalization,
)
# Elementwise merges: per particle when every input carries the particle axis in one layout.
MERGES = (_L.Add, _L.Subtract, _L.Multiply, _L.Average, _L.Maximum, _L.Minimum)
# Per particle when none of their axes is the batch or the particle axis.
AXIS_ARGUMENT = (
    _L.Softmax,
    _L.LayerNormalization,
    _L.UnitNormalization,
    _L.RMSNormalization,
    _L.Concatenate,
)

# keras.ops that act elementwise (on particle tensors of one layout, or with Python numbers)
ELEMENTWISE_OPS = {
    "Add",
    "Subtract",
    "Multiply",
    "Divide",
    "TrueDivide",
    "Negative",
    "Abs",
    "Exp",
    "Log",
    "Sqrt",
    "Square",
    "Tanh",
    "Sigmoid",
    "Relu",
    "Power",
    "Maximum",
    "Minimum",
    "Cast",
    "Equal",
    "NotEqual",
    "Greater",
    "GreaterEqual",
    "Less",
    "LessEqual",
    "LogicalAnd",
    "LogicalOr",
    "LogicalNot",
}
# keras.ops reductions: per particle when they reduce the last axis only (e.g. the mask of keras.layers.Masking)
LAST_AXIS_OPS = {"Any", "All", "Sum", "Mean", "Max", "Min"}

_PER_PARTICLE = (
    "bayes_keras.layers.PerParticle({}(...)) (applies a per-example layer to each particle)"
)
# exact classes: what to use instead
REPLACEMENTS = {
    _L.BatchNormalization: "bayes_keras.layers.BatchNormalization (per-particle statistics)",
    _L.Flatten: "bayes_keras.layers.Flatten",
    _L.GlobalAveragePooling1D: "bayes_keras.layers.GlobalAveragePooling1D",
    _L.GlobalAveragePooling2D: "bayes_keras.layers.GlobalAveragePooling2D",
    _L.GlobalMaxPooling1D: "bayes_keras.layers.GlobalMaxPooling1D",
    _L.GlobalMaxPooling2D: "bayes_keras.layers.GlobalMaxPooling2D",
    _L.MaxPooling2D: "bayes_keras.layers.MaxPooling2D",
    _L.AveragePooling2D: "bayes_keras.layers.AveragePooling2D",
    _L.Conv1D: "bayes_keras.layers.Conv1D",
    _L.Conv2D: "bayes_keras.layers.Conv2D",
    _L.DepthwiseConv2D: "bayes_keras.layers.DepthwiseConv2D",
    _L.SeparableConv2D: "bayes_keras.layers.SeparableConv2D",
    _L.SimpleRNN: "bayes_keras.layers.SimpleRNN",
    _L.LSTM: "bayes_keras.layers.LSTM",
    _L.GRU: "bayes_keras.layers.GRU",
    _L.Bidirectional: "bayes_keras.layers.Bidirectional around a bayes_keras recurrent layer",
    _L.SpatialDropout1D: "bayes_keras.layers.Dropout (its mask would be shared across the particle axis)",
    _L.SpatialDropout2D: _PER_PARTICLE.format("keras.layers.SpatialDropout2D"),
    _L.SpatialDropout3D: _PER_PARTICLE.format("keras.layers.SpatialDropout3D"),
    _L.GroupNormalization: "keras.layers.LayerNormalization (acts per particle), or "
    + _PER_PARTICLE.format("keras.layers.GroupNormalization"),
    _L.MultiHeadAttention: "bayes_keras.layers.MultiHeadAttention (attention over time for each particle)",
    _L.EinsumDense: "bayes_keras.layers.EinsumDense",
}


def axes_of(value):
    return (
        []
        if value is None
        else [int(a) for a in (value if isinstance(value, (list, tuple)) else [value])]
    )


def refusal(layer, shapes, carries):
    """Why the plain Keras `layer`, called on inputs of `shapes` (`carries`: which have the particle axis),
    would mix particles or drop the particle axis, with what to use instead; None when it acts per particle."""
    cls = type(layer)
    name = f"keras.layers.{cls.__name__}" if cls.__module__.startswith("keras") else cls.__name__
    if cls in REPLACEMENTS:
        return f"would mix the particles or drop the particle axis. Use {REPLACEMENTS[cls]}"
    if isinstance(layer, PER_ELEMENT):
        return None
    if isinstance(layer, MERGES + AXIS_ARGUMENT):
        ranks = {len(s) for s in shapes}
        if not all(carries) or len(ranks) != 1:
            return (
                "merges tensors with and without the particle axis (or of different layouts), which Keras "
                "would broadcast wrongly. Use "
                + _PER_PARTICLE.format(name)
                + " with particle_inputs=[...]"
            )
        if isinstance(layer, AXIS_ARGUMENT):
            rank = ranks.pop()
            for axis in axes_of(layer.axis):
                if axis % rank in (0, particle_axis(rank)):
                    which = "batch" if axis % rank == 0 else "particle"
                    return (
                        f"has axis={layer.axis!r}, which on (batch, particles, ...) activations of rank {rank} is "
                        f"the {which} axis: it would mix the particles. Give the axis in the particle layout "
                        f"(the particle axis is {particle_axis(rank)}) or use "
                        + _PER_PARTICLE.format(name)
                        + " to keep the plain Keras meaning of the axis"
                    )
        return None
    return (
        "is not known to act on each particle separately (it may read axis 1 as space or time, pool, attend "
        "or reshape across it), so it would mix the particles or drop the particle axis. Use "
        + _PER_PARTICLE.format(name)
        + " if it treats the examples of a batch independently"
    )


def operation_refusal(op, shapes, carries):
    """Why a keras.ops operation (not a layer) on particle activations is refused; None for elementwise
    operations over tensors that all carry the particle axis in one layout, and reductions of the last axis."""
    ranks = {len(s) for s in shapes}
    kind = type(op).__name__
    last_axis = (
        kind in LAST_AXIS_OPS
        and len(ranks) == 1
        and getattr(op, "axis", None) is not None
        and all(a % next(iter(ranks)) == next(iter(ranks)) - 1 for a in axes_of(op.axis))
    )
    if (kind in ELEMENTWISE_OPS or last_axis) and all(carries) and len(ranks) == 1:
        return None
    return (
        f"the operation '{op.name}' (keras.ops {kind}) acts on (batch, particles, ...) activations and bayes_keras "
        "cannot tell how it treats the particle axis (only elementwise operations and reductions of the last "
        "axis are accepted). Write it as a Keras layer and wrap that in bayes_keras.layers.PerParticle, which "
        "applies it to each particle"
    )


UNKNOWN_LENGTH = 5  # the size the one-time checks give axes of unknown size


def probe_length(num_particles):
    """The size the one-time checks give axes of unknown size (a sequence length): never the number of particles,
    so that a layer that reads the particle axis as its time axis cannot pass them by coincidence."""
    return UNKNOWN_LENGTH + (num_particles == UNKNOWN_LENGTH)


def perturbed_outputs(layer, shapes, dtypes, batch, perturb, length=UNKNOWN_LENGTH):
    """Run `layer` (inference mode) on random inputs of `shapes` / `dtypes` with `batch` examples, then on
    `perturb(values)` (the same inputs with something changed); the two lists of numpy outputs, or None when
    the layer does not run on such inputs. Unknown axes (a sequence length) get `length`, the same in every
    input. The shared core of the one-time checks that a layer keeps particles apart (`mixing_found`) and
    examples apart (bayesianize)."""
    shapes = [tuple(length if d is None else d for d in tuple(s)[1:]) for s in shapes]
    rng = np.random.default_rng(0)
    values = [
        rng.standard_normal((batch,) + s).astype(dtype)
        if "float" in dtype
        else np.zeros((batch,) + s, dtype)
        for s, dtype in zip(shapes, dtypes)
    ]

    def run(arrays):
        args = arrays[0] if len(arrays) == 1 else arrays
        return [np.asarray(y) for y in keras.tree.flatten(layer(args, training=False))]

    try:
        return run(values), run(perturb([v.copy() for v in values]))
    except Exception:  # noqa: BLE001 - a layer that cannot run eagerly here is not confirmed by this check
        return None


def mixing_found(layer, inputs, carries, num_particles):
    """Call `layer` on random inputs of the shapes of `inputs` with batch 2, again with the first particle of
    every particle input perturbed, and say how it mixed particles (None if every other particle's output is
    bit-identical, or if the shapes are not concrete or it does not run)."""

    def first_particle_moved(values):
        for v, c in zip(values, carries):
            if c:
                index = [slice(None)] * v.ndim
                index[particle_axis(v.ndim)] = 0
                v[tuple(index)] += 1.0
        return values

    outputs = perturbed_outputs(
        layer,
        [tuple(t.shape) for t in inputs],
        [keras.backend.standardize_dtype(t.dtype) for t in inputs],
        2,
        first_particle_moved,
        probe_length(num_particles),
    )
    if outputs is None:
        return None
    for a, b in zip(*outputs):
        if a.ndim < 3 or a.shape[particle_axis(a.ndim)] != num_particles:
            return f"returns shape {a.shape[1:]} per example, without the particle axis"
        others = np.take(a, range(1, num_particles), axis=particle_axis(a.ndim))
        if not np.array_equal(
            others, np.take(b, range(1, num_particles), axis=particle_axis(b.ndim))
        ):
            return "changes the other particles' outputs when one particle's input changes"
    return None


def _starts_particles(layer):
    """A bayes_keras layer made of particle sublayers (attention, a converted custom layer, Bidirectional) that
    may start the particle axis: it holds particle weights or was given num_particles."""
    return _is_particle_aware(layer) and (
        getattr(layer, "_given_num_particles", None) is not None
        or any(getattr(v, "is_particle_variable", False) for v in layer.weights)
    )


def _is_particle_aware(layer):
    return type(layer).__module__.startswith("bayes_keras.")


def check_layers_keep_particles(layers, particle_layer_types):
    """Raise a ValueError for the first plain Keras layer or keras.ops operation in `layers` (a functional
    model's operations, topological order) that receives a particle-axis tensor and would mix particles or
    drop the axis (module docstring).

    A tensor carries the particle axis if it is the output of a particle layer (an instance of
    `particle_layer_types`) or of any layer that received one. Returns the ids of the layers that receive one."""
    carrying = {}  # id(tensor) -> True
    received = set()
    started = False
    for layer in layers:
        try:
            inputs, outputs = layer.input, layer.output
        except (AttributeError, ValueError):  # input layers, or a layer called more than once
            if started and not isinstance(layer, _L.InputLayer):
                raise ValueError(
                    f"Layer '{layer.name}' is called more than once after the particle layers begin; bayes_keras "
                    "checks each layer's particle layout through its one call. Use a separate layer instance per "
                    "call."
                ) from None
            continue
        flat_inputs = [t for t in keras.tree.flatten(inputs) if isinstance(t, keras.KerasTensor)]
        carries = [id(t) in carrying for t in flat_inputs]
        if any(carries):
            received.add(id(layer))
        if not isinstance(layer, _L.Layer):  # a keras.ops operation in a functional model
            if any(carries):
                problem = operation_refusal(layer, [tuple(t.shape) for t in flat_inputs], carries)
                if problem is not None:
                    raise ValueError(f"BayesianModel: {problem}.")
                carrying.update((id(t), True) for t in keras.tree.flatten(outputs))
            continue
        if (
            isinstance(layer, particle_layer_types)
            or _starts_particles(layer)
            or (any(carries) and _is_particle_aware(layer))
        ):
            carrying.update((id(t), True) for t in keras.tree.flatten(outputs))
            started = True
            continue
        if not any(carries):
            continue
        where = f"Layer '{layer.name}' ({type(layer).__module__.split('.')[0]}.layers.{type(layer).__name__})"
        problem = refusal(layer, [tuple(t.shape) for t in flat_inputs], carries)
        if problem is None:
            n = next(
                t.shape[particle_axis(len(t.shape))] for t, c in zip(flat_inputs, carries) if c
            )
            problem = mixing_found(layer, flat_inputs, carries, n)
            if problem is not None:
                problem = (
                    f"receives (batch, particles, ...) activations and {problem}: it would mix the particles. "
                    "Use " + _PER_PARTICLE.format(f"keras.layers.{type(layer).__name__}")
                )
        else:
            problem = "receives (batch, particles, ...) activations and " + problem
        if problem is not None:
            raise ValueError(f"{where} {problem}.")
        carrying.update((id(t), True) for t in keras.tree.flatten(outputs))
    return received
