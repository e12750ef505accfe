"""LayerNormalization with a per-particle scale and offset."""

import keras
import tensorflow as tf

from bayes_keras import priors as priors_lib
from bayes_keras._config import check_number
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.particle_layout import per_particle_shape


@keras.saving.register_keras_serializable(package="bayes_keras")
class LayerNormalization(ParticleLayer):
    """Layer normalization (Ba et al. 2016, https://arxiv.org/abs/1607.06450, Eq. 4) over the last axis of
    (batch, N, ..., C) activations, with one scale gamma and offset beta per particle: each particle is a
    network with its own `keras.layers.LayerNormalization(axis=-1)` (tested). (Keras' own layer on the same
    tensors also acts per particle, with gamma and beta shared: the deterministic variant.)

    Further arguments:

    - epsilon, center, scale: as in `keras.layers.LayerNormalization` (axis -1).
    - gamma_initializer, beta_initializer: default ones / zeros for a deterministic layer and per
      particle plus N(0, 0.01^2) otherwise (particles equal on a coordinate stay equal under GPF).

    Args:
        gamma_prior: default N(1, 1); beta_prior: default N(0, 1).

    Example:
        >>> h = bayes_keras.layers.Dense(64, num_particles=8)(inputs)
        >>> h = bayes_keras.layers.LayerNormalization()(h)
    """

    def __init__(
        self,
        epsilon=1e-3,
        center=True,
        scale=True,
        gamma_initializer=None,
        beta_initializer=None,
        gamma_prior=None,
        beta_prior=None,
        **kwargs,
    ):
        kwargs.setdefault(
            "kernel_prior", gamma_prior if gamma_prior is not None else priors_lib.Normal(1.0, 1.0)
        )
        kwargs.setdefault("bias_prior", beta_prior)
        if kwargs.get("axis", -1) in (-1, [-1]):
            kwargs.pop("axis", None)
        else:
            raise ValueError(
                f"LayerNormalization normalizes the last axis; got axis={kwargs['axis']!r}."
            )
        if kwargs.get("num_particles") is not None:
            raise ValueError(
                "LayerNormalization normalizes particle activations: place it after the layer where "
                "the particle axis begins (num_particles goes there)."
            )
        super().__init__(**kwargs)
        epsilon = check_number(epsilon, "LayerNormalization epsilon")
        if not float(epsilon) > 0.0:
            raise ValueError(f"LayerNormalization epsilon must be positive; got {epsilon!r}.")
        self.epsilon, self.center, self.scale = float(epsilon), bool(center), bool(scale)
        spread = 0.0 if self.deterministic else 0.01
        self.gamma_initializer = keras.initializers.get(
            gamma_initializer
            if gamma_initializer is not None
            else keras.initializers.RandomNormal(1.0, spread)
            if spread
            else "ones"
        )
        self.beta_initializer = keras.initializers.get(
            beta_initializer
            if beta_initializer is not None
            else keras.initializers.RandomNormal(0.0, spread)
            if spread
            else "zeros"
        )
        self.supports_masking = True

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=len(input_shape) - 1)
        channels = input_shape[-1]
        if channels is None or len(input_shape) < 3:
            raise ValueError(
                f"LayerNormalization '{self.name}' expects (batch, particles, ..., channels) with known "
                f"channels; got {tuple(input_shape)}."
            )
        self.gamma = (
            self.add_particle_weight(
                "gamma", (channels,), self.gamma_initializer, self.kernel_prior, channels
            )
            if self.scale
            else None
        )
        self.beta = (
            self.add_particle_weight(
                "beta", (channels,), self.beta_initializer, self.bias_prior, channels
            )
            if self.center
            else None
        )

    def _per_particle(self, value, rank):
        if len(value.shape) == 1:
            return value
        return tf.reshape(value, per_particle_shape(rank, self.num_particles, value.shape[-1]))

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs)
        compute, rank = x.dtype, len(x.shape)
        x32 = tf.cast(x, tf.float32) if compute in (tf.float16, tf.bfloat16) else x
        mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
        y = (x32 - mean) * tf.math.rsqrt(variance + self.epsilon)
        if self.gamma is not None:
            y = y * self._per_particle(tf.cast(self.gamma, y.dtype), rank)
        if self.beta is not None:
            y = y + self._per_particle(tf.cast(self.beta, y.dtype), rank)
        return tf.cast(y, compute)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "epsilon": self.epsilon,
                "center": self.center,
                "scale": self.scale,
                "gamma_initializer": keras.initializers.serialize(self.gamma_initializer),
                "beta_initializer": keras.initializers.serialize(self.beta_initializer),
            }
        )
        config.pop("num_particles", None)
        return config
