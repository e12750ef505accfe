"""Flatten that keeps the batch and particle axes."""

import math

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="bayes_keras")
class Flatten(keras.layers.Layer):
    """(batch, N, d1, d2, ...) -> (batch, N, d1*d2*...).

    Example:
        >>> h = bayes_keras.layers.Flatten()(h)
    """

    def call(self, inputs):
        if len(inputs.shape) < 3:
            raise ValueError(f"Flatten expects (batch, particles, ...); got shape {tuple(inputs.shape)}.")
        shape = tf.shape(inputs)
        return tf.reshape(inputs, tf.concat([shape[:2], [-1]], 0))

    def compute_output_shape(self, input_shape):
        rest = input_shape[2:]
        size = None if any(d is None for d in rest) else math.prod(rest)
        return (input_shape[0], input_shape[1], size)
