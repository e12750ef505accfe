"""Dropout whose mask is drawn independently for every particle, and under tf.distribute as one device draws it."""

import keras
import tensorflow as tf

from bayes_keras.training import distribute
from bayes_keras._config import check_number
from bayes_keras.layers._random import draw_as_one_device


@keras.saving.register_keras_serializable(package="bayes_keras")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` on (batch, N, ...): each particle gets its own mask (active in training only).

    Under tf.distribute (data or particle parallel) the mask is drawn for the global batch and every particle and
    each replica keeps its part, so training equals one device's. Placed before the first particle layer (on
    (batch, ...)), it draws per example.

    Example:
        >>> h = bayes_keras.layers.Dropout(0.25)(h)
    """

    receives_particles = True  # set by BayesianModel from the model's graph
    # under tf.distribute (bayes_keras.training.call_checks.random_layers)
    draws_as_one_device = True

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        rate = check_number(rate, "Dropout rate", positive=False)
        super().__init__(rate, noise_shape=noise_shape, seed=seed, **kwargs)

    def call(self, inputs, training=False):
        if not (training and self.rate > 0 and distribute.distributed(self)):
            return super().call(inputs, training=training)
        x = tf.convert_to_tensor(inputs)
        keep = draw_as_one_device(
            self,
            x,
            lambda shape: keras.random.dropout(
                tf.ones(shape, x.dtype), self.rate, seed=self.seed_generator
            ),
            self.noise_shape,
        )
        return x * keep
