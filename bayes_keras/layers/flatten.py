"""Flatten that keeps the batch and particle axes."""

import math

import keras
import tensorflow as tf

from bayes_keras.layers.particle_layout import IMAGE_RANK, particle_axis


@keras.saving.register_keras_serializable(package="bayes_keras")
class Flatten(keras.layers.Layer):
    """(batch, N, d1, d2, ...) -> (batch, N, d1*d2*...); particle images (batch, H, W, N, C) -> (batch, N, H*W*C)
    in Keras' Flatten order per particle (one transpose: the image layout keeps particles next to the channels).

    Example:
        >>> h = bayes_keras.layers.Flatten()(h)
    """

    def call(self, inputs):
        if len(inputs.shape) < 3:
            raise ValueError(
                f"Flatten expects (batch, particles, ...); got shape {tuple(inputs.shape)}."
            )
        if len(inputs.shape) == IMAGE_RANK:
            inputs = tf.transpose(inputs, [0, 3, 1, 2, 4])  # (B, H, W, N, C) -> (B, N, H, W, C)
        shape = tf.shape(inputs)
        rest = inputs.shape[2:]
        # The flattened width from the static shape when known: -1 cannot be inferred for an empty batch
        # (e.g. a replica's share of a global batch smaller than the number of replicas).
        width = math.prod(rest) if all(d is not None for d in rest) else -1
        return tf.reshape(inputs, tf.concat([shape[:2], [width]], 0))

    def compute_output_shape(self, input_shape):
        axis = particle_axis(len(input_shape))
        rest = [d for i, d in enumerate(input_shape) if i not in (0, axis)]
        size = None if any(d is None for d in rest) else math.prod(rest)
        return (input_shape[0], input_shape[axis], size)
