"""LoRAEinsumDense: a frozen EinsumDense kernel shared by all particles plus rank-r factors per particle."""

import math

import keras
import tensorflow as tf

from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.einsum_dense import (
    particle_equations,
    einsum_shapes,
    parse_equation,
    particle_output_shape,
    resolve_particle_input,
    tile_particles,
)

# the einsum letter of the adapter's rank axis (Keras' equations use lower-case letters)
_RANK = "R"


def _assemble(input_spec, kernel_spec, output_spec, side):
    if side == "left":
        return f"...{input_spec},{kernel_spec}->...{output_spec}"
    if side == "right":
        return f"{input_spec}...,{kernel_spec}->{output_spec}..."
    return f"{input_spec},{kernel_spec}->{output_spec}"


@keras.saving.register_keras_serializable(package="bayes_keras")
class LoRAEinsumDense(ParticleLayer):
    """Bayesian LoRA for `keras.layers.EinsumDense` (and Dense: equation '...b,bc->...c'): the kernel W and bias
    are frozen, stored once and shared by all particles; each particle n adds a rank-r update, as Keras'
    `enable_lora` does for one network:

        kernel_n = W + (lora_alpha / rank) * A_n @ B_n,   A_n: kernel_shape[:-1] + (rank,),  B_n: (rank, kernel_shape[-1])

    (the matrix product over the kernel's last axis, Keras' definition). The factors carry the particle axis and
    the prior; the frozen weights do not (they are the pretrained network's point estimate). Computed as
    x W + (lora_alpha / rank) (x A_n) B_n: the shared product once, the low-rank one per particle. Inputs as
    `bayes_keras.layers.EinsumDense`: (batch, N, ...) from a particle layer, or (batch, ...) where
    `num_particles` starts the particle axis; the output always carries it.

    A_n is drawn per particle (`a_initializer`, Keras' he_uniform) and B_n starts near zero (N(0, 0.01^2) per
    particle; Keras starts B at zero, which would make every particle's update zero and, under GPF's affine
    flow or SVGD's kernel, keep them equal). With `deterministic=True` the factors are one shared adapter: plain
    LoRA, a point estimate.

    Reference: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", https://arxiv.org/abs/2106.09685.

    Further arguments:

    - equation, output_shape, activation, bias_axes: as in `keras.layers.EinsumDense`.
    - kernel_initializer, bias_initializer: of the frozen weights (normally set from a trained layer).
    - a_initializer, b_initializer: of the factors (b default: N(0, 0.01^2) per particle, zeros when
      deterministic).
    - num_particles, deterministic, kernel_prior: see `ParticleLayer` (`kernel_prior` is the factors' prior).

    Args:
        rank: the adapter's rank r. lora_alpha: the update's scale numerator (default: rank, as Keras).

    Example:
        >>> h = keras.Input((16, 32))
        >>> q = bayes_keras.layers.LoRAEinsumDense("abc,cde->abde", (None, 4, 8), bias_axes="de", rank=4,
        ...                                        num_particles=8)(h)       # (batch, 8, 16, 4, 8)
    """

    def __init__(
        self,
        equation,
        output_shape,
        rank,
        lora_alpha=None,
        activation=None,
        bias_axes=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        a_initializer="he_uniform",
        b_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"LoRAEinsumDense rank must be a positive integer; got {rank!r}.")
        if lora_alpha is not None and (
            isinstance(lora_alpha, bool)
            or not isinstance(lora_alpha, (int, float))
            or not lora_alpha > 0
        ):
            raise ValueError(
                f"LoRAEinsumDense lora_alpha must be a positive number or None; got {lora_alpha!r}."
            )
        self.equations = particle_equations(equation)
        self.equation = equation
        self.partial_output_shape = (
            (output_shape,) if isinstance(output_shape, int) else tuple(output_shape)
        )
        self.rank = rank
        self.lora_alpha = rank if lora_alpha is None else lora_alpha
        self.activation = keras.activations.get(activation)
        self.bias_axes = bias_axes or None
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.a_initializer = keras.initializers.get(a_initializer)
        if b_initializer is None:
            b_initializer = (
                "zeros" if self.deterministic else keras.initializers.RandomNormal(stddev=0.01)
            )
        self.b_initializer = keras.initializers.get(b_initializer)
        input_spec, kernel_spec, output_spec, side = parse_equation(equation)
        last = kernel_spec[-1]
        # x A_n: the equation with the kernel's last axis replaced by the rank axis; then (x A_n) B_n contracts it
        self._factorized = last in output_spec
        if self._factorized:
            middle = output_spec.replace(last, _RANK)
            self._a_equations = particle_equations(
                _assemble(input_spec, kernel_spec[:-1] + _RANK, middle, side)
            )
            self._b_equation = particle_equations(
                _assemble(middle, _RANK + last, output_spec, side)
            )

    @property
    def scale(self):
        return self.lora_alpha / self.rank

    def build(self, input_shape):
        kernel_shape, bias_shape, _, _, _ = einsum_shapes(
            self.equation,
            self.bias_axes,
            resolve_particle_input(self, tuple(input_shape)),
            self.partial_output_shape,
        )
        self.kernel = self.add_weight(
            name="kernel",
            shape=tuple(kernel_shape),
            initializer=self.kernel_initializer,
            trainable=False,
        )
        self.bias = (
            None
            if bias_shape is None
            else self.add_weight(
                name="bias",
                shape=tuple(bias_shape),
                initializer=self.bias_initializer,
                trainable=False,
            )
        )
        fan_in = math.prod(kernel_shape[:-1])
        self.lora_kernel_a = self.add_particle_weight(
            "lora_kernel_a",
            tuple(kernel_shape[:-1]) + (self.rank,),
            self.a_initializer,
            self.kernel_prior,
            fan_in,
        )
        self.lora_kernel_b = self.add_particle_weight(
            "lora_kernel_b",
            (self.rank, kernel_shape[-1]),
            self.b_initializer,
            self.kernel_prior,
            self.rank,
        )

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs)
        carries = not self.broadcasts
        y = tf.einsum(self.equations["shared"] if carries else self.equation, x, self.kernel)
        if self.bias is not None:
            y = y + self.bias
        scale = tf.cast(self.scale, y.dtype)
        if self.deterministic:
            update = self._update(
                x, self.lora_kernel_a, self.lora_kernel_b, shared=True, carries=carries
            )
            y = y + scale * update
            return self.activation(y if carries else tile_particles(y, self._given_num_particles))
        update = self._update(
            x, self.lora_kernel_a, self.lora_kernel_b, shared=False, carries=carries
        )
        if not carries:
            # the shared product, computed once, broadcast over the particles
            y = tf.expand_dims(y, 1)
        return self.activation(y + scale * update)

    def _update(self, x, a, b, shared, carries):
        """x A B (particle factors: one per particle) in the output's layout."""
        # one adapter: its update A B is one kernel, applied with the shared kernel's equation
        if shared:
            return tf.einsum(
                self.equations["shared"] if carries else self.equation,
                x,
                tf.tensordot(a, b, axes=[[-1], [0]]),
            )
        mode = "particles" if carries else "broadcast"
        if not self._factorized:
            kernels = tf.einsum("p...r,prk->p...k", a, b)
            return tf.einsum(self.equations[mode], x, kernels)
        return tf.einsum(self._b_equation["particles"], tf.einsum(self._a_equations[mode], x, a), b)

    def compute_output_shape(self, input_shape):
        return particle_output_shape(self, input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "equation": self.equation,
                "output_shape": self.partial_output_shape,
                "rank": self.rank,
                "lora_alpha": self.lora_alpha,
                "activation": keras.activations.serialize(self.activation),
                "bias_axes": self.bias_axes,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "a_initializer": keras.initializers.serialize(self.a_initializer),
                "b_initializer": keras.initializers.serialize(self.b_initializer),
            }
        )
        return config
