"""Pooling layers for particle images (batch, H, W, N, C): Keras' pooling over the (batch, H, W, N*C) view."""

import keras

from bayes_keras.layers.particle_layout import merge_particle_channels, split_particle_channels


class _ParticlePooling2D(keras.layers.Layer):
    _keras_class = None

    def __init__(self, pool_size=(2, 2), strides=None, padding="valid", **kwargs):
        super().__init__(**kwargs)
        self._pool = self._keras_class(
            pool_size=pool_size, strides=strides, padding=padding, dtype=self.dtype_policy
        )
        self.pool_size, self.strides, self.padding = (
            self._pool.pool_size,
            self._pool.strides,
            self._pool.padding,
        )

    def call(self, inputs):
        if len(inputs.shape) != 5 or inputs.shape[-1] is None or inputs.shape[-2] is None:
            raise ValueError(
                f"{type(self).__name__} expects particle images (batch, H, W, particles, C) with known particles and "
                f"channels; got shape {tuple(inputs.shape)}."
            )
        n, c = inputs.shape[-2], inputs.shape[-1]
        y = self._pool(merge_particle_channels(inputs, n))  # pools each channel
        return split_particle_channels(y, n, c)

    def compute_output_shape(self, input_shape):
        inner = self._pool.compute_output_shape(tuple(input_shape[:3]) + (input_shape[-1],))
        return tuple(inner[:3]) + tuple(input_shape[3:])

    def get_config(self):
        config = super().get_config()
        config.update(
            {"pool_size": self.pool_size, "strides": self.strides, "padding": self.padding}
        )
        return config


@keras.saving.register_keras_serializable(package="bayes_keras")
class MaxPooling2D(_ParticlePooling2D):
    """`keras.layers.MaxPooling2D` applied to every particle: (batch, H, W, N, C) -> (batch, H', W', N, C).

    Example:
        >>> h = bayes_keras.layers.MaxPooling2D(2)(h)
    """

    _keras_class = keras.layers.MaxPooling2D


@keras.saving.register_keras_serializable(package="bayes_keras")
class AveragePooling2D(_ParticlePooling2D):
    """`keras.layers.AveragePooling2D` applied to every particle: (batch, H, W, N, C) -> (batch, H', W', N, C).

    Example:
        >>> h = bayes_keras.layers.AveragePooling2D(2)(h)
    """

    _keras_class = keras.layers.AveragePooling2D
