"""Pooling layers that keep the particle axis (particles folded into the batch axis)."""

import keras
import tensorflow as tf


class _ParticlePooling2D(keras.layers.Layer):
    _keras_class = None

    def __init__(self, pool_size=(2, 2), strides=None, padding="valid", **kwargs):
        super().__init__(**kwargs)
        self._pool = self._keras_class(pool_size=pool_size, strides=strides, padding=padding)
        self.pool_size, self.strides, self.padding = self._pool.pool_size, self._pool.strides, self._pool.padding

    def call(self, inputs):
        if len(inputs.shape) != 5:
            raise ValueError(
                f"{type(self).__name__} expects (batch, particles, H, W, C); got shape {tuple(inputs.shape)}."
            )
        shape = tf.shape(inputs)
        y = self._pool(tf.reshape(inputs, tf.concat([[-1], shape[2:]], 0)))
        return tf.reshape(y, tf.concat([shape[:2], tf.shape(y)[1:]], 0))

    def compute_output_shape(self, input_shape):
        inner = self._pool.compute_output_shape((None,) + tuple(input_shape[2:]))
        return tuple(input_shape[:2]) + tuple(inner[1:])

    def get_config(self):
        config = super().get_config()
        config.update({"pool_size": self.pool_size, "strides": self.strides, "padding": self.padding})
        return config


@keras.saving.register_keras_serializable(package="bayes_keras")
class MaxPooling2D(_ParticlePooling2D):
    """`keras.layers.MaxPooling2D` applied to every particle: (batch, N, H, W, C) -> (batch, N, H', W', C).

    Example:
        >>> h = bayes_keras.layers.MaxPooling2D(2)(h)
    """

    _keras_class = keras.layers.MaxPooling2D


@keras.saving.register_keras_serializable(package="bayes_keras")
class AveragePooling2D(_ParticlePooling2D):
    """`keras.layers.AveragePooling2D` applied to every particle: (batch, N, H, W, C) -> (batch, N, H', W', C).

    Example:
        >>> h = bayes_keras.layers.AveragePooling2D(2)(h)
    """

    _keras_class = keras.layers.AveragePooling2D
