"""EinsumDense with one kernel per particle."""

import re

import keras
import tensorflow as tf

from bayes_keras.layers.particle_initializers import default_bias_initializer
from bayes_keras.layers.base import ParticleLayer

_FORMS = (  # the equations keras.layers.EinsumDense accepts: X,Y->Z  ...X,Y->...Z  X...,Y->Z...
    (re.compile(r"([a-zA-Z]+),([a-zA-Z]+)->([a-zA-Z]+)"), None),
    (re.compile(r"\.\.\.([a-zA-Z]+),([a-zA-Z]+)->\.\.\.([a-zA-Z]+)"), "left"),
    (re.compile(r"([a-zA-Z]{2,})\.\.\.,([a-zA-Z]+)->([a-zA-Z]+)\.\.\."), "right"),
)


def parse_equation(equation):
    """(input spec, kernel spec, output spec, elided side: None, "left" or "right") of an EinsumDense
    equation, or a ValueError naming the accepted forms."""
    if isinstance(equation, str):
        for form, side in _FORMS:
            match = form.fullmatch(equation.replace(" ", ""))
            if match:
                return match.group(1), match.group(2), match.group(3), side
    raise ValueError(
        f"EinsumDense equation must have the form 'X,Y->Z', '...X,Y->...Z' or 'X...,Y->Z...' "
        f"(letters; X's first letter the batch axis); got {equation!r}."
    )


def einsum_shapes(equation, bias_axes, input_shape, partial_output_shape):
    """(kernel shape, bias shape or None, output shape, kernel input axes, kernel output axes) of
    keras.layers.EinsumDense on an ordinary (batch, ...) input of `input_shape`, by Keras' rules."""
    input_spec, kernel_spec, output_spec, side = parse_equation(equation)
    elided = len(input_shape) - len(input_spec)
    if elided < 0 or (elided > 0 and side is None):
        raise ValueError(
            f"EinsumDense equation {equation!r} needs an input of rank {len(input_spec)}"
            f"{' or more' if side else ''}; got shape {tuple(input_shape)}."
        )
    output_shape = [input_shape[0]] + list(partial_output_shape)
    offset = elided if side == "left" else 0
    if side == "left":
        output_shape[1:1] = list(input_shape[1:elided])
    elif side == "right":
        output_shape += list(input_shape[len(input_shape) - elided :])
    input_axis = {d: i + offset for i, d in enumerate(input_spec)}
    output_axis = {d: i + offset for i, d in enumerate(output_spec)}
    if len(output_shape) != len(output_spec) + elided:
        raise ValueError(
            f"EinsumDense output_shape {tuple(partial_output_shape)} does not fit the equation "
            f"{equation!r}: it gives the output axes after the batch axis ({len(output_spec) - 1})."
        )
    for d in input_spec:
        if d in output_axis and output_shape[output_axis[d]] not in (
            None,
            input_shape[input_axis[d]],
        ):
            raise ValueError(
                f"EinsumDense: input shape and output_shape disagree at axis '{d}' of {equation!r}: "
                f"{input_shape[input_axis[d]]} vs {output_shape[output_axis[d]]}."
            )
        if d in output_axis:
            output_shape[output_axis[d]] = input_shape[input_axis[d]]
    kernel_shape, input_axes, output_axes = [], [], []
    for i, d in enumerate(kernel_spec):
        if d in output_axis:
            kernel_shape.append(output_shape[output_axis[d]])
            output_axes.append(i)
        elif d in input_axis:
            kernel_shape.append(input_shape[input_axis[d]])
            input_axes.append(i)
        else:
            raise ValueError(
                f"EinsumDense: kernel axis '{d}' of {equation!r} is in neither the input nor the output."
            )
    bias_shape = None
    if bias_axes:
        unknown = [d for d in bias_axes if d not in output_spec]
        if unknown:
            raise ValueError(
                f"EinsumDense bias_axes {bias_axes!r} names {unknown}, not in the output spec "
                f"'{output_spec}' of {equation!r}."
            )
        first = min(output_spec.find(d) for d in bias_axes)
        bias_shape = [
            output_shape[output_axis[d]] if d in bias_axes else 1 for d in output_spec[first:]
        ]
        bias_shape += [1] * (elided if side == "right" else 0)
    return kernel_shape, bias_shape, output_shape, input_axes, output_axes


def particle_equations(equation):
    """The equation on (batch, N, ...) inputs with (N, ...) kernels ("particles"), on (batch, N, ...) inputs
    with a shared kernel ("shared"), and on (batch, ...) inputs with (N, ...) kernels ("broadcast"): the
    particle letter follows the batch letter, and leads in the kernel."""
    input_spec, kernel_spec, output_spec, side = parse_equation(equation)
    free = [
        c for c in "pqrstuvwxyzabcdefghijklmno" if c not in input_spec + kernel_spec + output_spec
    ]
    p = free[0]
    if side == "left":  # the batch axis is the first of the ellipsis
        z = free[1]
        return {
            "particles": f"{z}{p}...{input_spec},{p}{kernel_spec}->{z}{p}...{output_spec}",
            "shared": f"{z}{p}...{input_spec},{kernel_spec}->{z}{p}...{output_spec}",
            "broadcast": f"{z}...{input_spec},{p}{kernel_spec}->{z}{p}...{output_spec}",
        }
    batch, tail = input_spec[0], "..." if side == "right" else ""
    if output_spec[0] != batch:
        raise ValueError(
            f"EinsumDense equation {equation!r}: the output must start with the batch axis "
            f"'{batch}' (the particle axis follows it)."
        )
    x, y = f"{batch}{p}{input_spec[1:]}{tail}", f"{batch}{p}{output_spec[1:]}{tail}"
    return {
        "particles": f"{x},{p}{kernel_spec}->{y}",
        "shared": f"{x},{kernel_spec}->{y}",
        "broadcast": f"{input_spec}{tail},{p}{kernel_spec}->{y}",
    }


def example_shape(layer, input_shape):
    """The input shape of one particle's (Keras) layer: the particle axis (after the batch axis) removed."""
    shape = tuple(input_shape)
    return shape if layer.broadcasts else shape[:1] + shape[2:]


def resolve_particle_input(layer, shape):
    """For an einsum particle layer (`layer.equation`, `layer.broadcasts`): check the input's rank, read N from its
    particle axis (axis 1 at every rank) and return one particle's input shape."""
    input_spec, _, _, side = parse_equation(layer.equation)
    rank = len(input_spec) + (0 if layer.broadcasts else 1)
    if (
        len(shape) < rank
        or (side is None and len(shape) != rank)
        or (not layer.broadcasts and shape[1] is None)
    ):
        where = (
            "(batch, ...)"
            if layer.broadcasts
            else "(batch, particles, ...) from a previous particle layer"
        )
        raise ValueError(
            f"{type(layer).__name__} '{layer.name}' with equation {layer.equation!r} expects {where} of "
            f"rank {rank}{' or more' if side else ''}; got shape {shape}."
            + (
                ""
                if layer.broadcasts
                else " If this is the first Bayesian layer, pass num_particles=N to it."
            )
        )
    if not layer.broadcasts:
        layer.num_particles = int(shape[1])
    return example_shape(layer, shape)


def particle_output_shape(layer, input_shape):
    """An einsum particle layer's output shape: Keras' for one particle, with the particle axis after the batch."""
    shape = tuple(input_shape)
    _, _, output, _, _ = einsum_shapes(
        layer.equation, layer.bias_axes, example_shape(layer, shape), layer.partial_output_shape
    )
    n = layer._given_num_particles if layer.broadcasts else shape[1]
    return tuple(output[:1]) + (n,) + tuple(output[1:])


def tile_particles(y, num_particles):
    """A shared (batch, ...) result with the particle axis inserted after the batch axis."""
    y = tf.expand_dims(y, 1)
    return tf.tile(y, [1, num_particles] + [1] * (len(y.shape) - 2))


@keras.saving.register_keras_serializable(package="bayes_keras")
class EinsumDense(ParticleLayer):
    """`keras.layers.EinsumDense` whose kernel is an (N, ...) stack of particles: each particle applies the
    equation with its own kernel (and bias), in one einsum. The particle axis follows the batch axis:
    (batch, N, ...) -> (batch, N, ...); a layer given `num_particles` takes Keras' (batch, ...) input.

    The equation is Keras': 'X,Y->Z', '...X,Y->...Z' or 'X...,Y->Z...', written for one particle on an
    ordinary batch (X's first letter, or the first axis of a leading '...', is the batch axis); the layer
    adds the particle letter after the batch letter in the input and output and in front of the kernel
    ('abc,cde->abde' runs as 'apbc,pcde->apbde'). Kernel and bias shapes per particle are those of
    `keras.layers.EinsumDense`, so a Keras layer's weights are one particle of this one. The particle axis is
    axis 1 at every rank here, also at rank 5 (where the convolution layers' image layout has it at axis 3):
    a rank-5 output, such as attention's (batch, N, time, heads, dim) projections, is for layers that read it
    so (`MultiHeadAttention`).

    Further arguments:

    - equation, output_shape, activation, bias_axes, kernel_initializer: as in `keras.layers.EinsumDense`.
    - num_particles, deterministic, kernel_prior, bias_prior: see `ParticleLayer`.

    Args:
        bias_initializer: default zeros for a deterministic layer, N(0, 0.01^2) per particle otherwise.

    Example:
        >>> tokens = keras.Input((16, 32))                     # (batch, time, features)
        >>> q = bayes_keras.layers.EinsumDense("abc,cde->abde", (None, 4, 8), bias_axes="de",
        ...                                    num_particles=10)(tokens)    # (batch, 10, 16, 4, 8)
    """

    def __init__(
        self,
        equation,
        output_shape,
        activation=None,
        bias_axes=None,
        kernel_initializer="glorot_uniform",
        bias_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.equations = particle_equations(equation)
        self.equation = equation
        self.partial_output_shape = (
            (output_shape,) if isinstance(output_shape, int) else tuple(output_shape)
        )
        self.bias_axes = bias_axes or None
        self.activation = keras.activations.get(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(
            default_bias_initializer(bias_initializer, self.deterministic)
        )

    def build(self, input_shape):
        shape = tuple(input_shape)
        kernel_shape, bias_shape, _, input_axes, output_axes = einsum_shapes(
            self.equation,
            self.bias_axes,
            resolve_particle_input(self, shape),
            self.partial_output_shape,
        )
        if None in kernel_shape or (bias_shape and None in bias_shape):
            raise ValueError(
                f"EinsumDense '{self.name}': the kernel's axes must be known; input {shape}, "
                f"output_shape {self.partial_output_shape} give {kernel_shape}."
            )
        initializer = self.kernel_initializer
        if (
            isinstance(initializer, keras.initializers.VarianceScaling)
            and initializer.input_axes is None
        ):
            # as Keras: the fans counted over the kernel's input and output axes of the equation
            initializer = initializer.__class__.from_config(
                {**initializer.get_config(), "input_axes": input_axes, "output_axes": output_axes}
            )
        fan_in = 1
        for axis in input_axes:
            fan_in *= kernel_shape[axis]
        self.kernel = self.add_particle_weight(
            "kernel", kernel_shape, initializer, self.kernel_prior, fan_in
        )
        self.bias = None
        if bias_shape is not None:
            self.bias = self.add_particle_weight(
                "bias", bias_shape, self.bias_initializer, self.bias_prior, fan_in
            )

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs)
        if self.deterministic:
            if self.broadcasts:
                y = tf.einsum(self.equation, x, self.kernel)
                y = y if self.bias is None else y + self.bias
                return self.activation(tile_particles(y, self._given_num_particles))
            y = tf.einsum(self.equations["shared"], x, self.kernel)
            return self.activation(y if self.bias is None else y + self.bias)
        y = tf.einsum(
            self.equations["broadcast" if self.broadcasts else "particles"], x, self.kernel
        )
        # (N, *bias) -> (N, 1, ..., *bias), aligned with y's trailing axes after N
        if self.bias is not None:
            bias = tf.reshape(
                self.bias,
                [self.num_particles]
                + [1] * (len(y.shape) - 2 - len(self.bias.shape[1:]))
                + list(self.bias.shape[1:]),
            )
            y = y + bias
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        return particle_output_shape(self, input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "equation": self.equation,
                "output_shape": self.partial_output_shape,
                "activation": keras.activations.serialize(self.activation),
                "bias_axes": self.bias_axes,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
