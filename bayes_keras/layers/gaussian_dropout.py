"""GaussianDropout drawn independently for every particle, and under tf.distribute as one device draws it."""

import math

import keras
import tensorflow as tf

from bayes_keras.training import distribute
from bayes_keras._config import check_number
from bayes_keras.layers._random import draw_as_one_device


@keras.saving.register_keras_serializable(package="bayes_keras")
class GaussianDropout(keras.layers.GaussianDropout):
    """`keras.layers.GaussianDropout` (multiplicative N(1, rate / (1 - rate)) noise, in training only) on
    (batch, N, ...) activations. Under tf.distribute the noise is drawn for the global batch and every particle and
    each replica keeps its part, so training equals one device's.

    Example:
        >>> h = bayes_keras.layers.GaussianDropout(0.2)(h)
    """

    receives_particles = True  # set by BayesianModel from the model's graph
    # under tf.distribute (bayes_keras.training.call_checks.random_layers)
    draws_as_one_device = True

    def __init__(self, rate, seed=None, **kwargs):
        rate = check_number(rate, "GaussianDropout rate", allow_zero=True)
        if rate >= 1:
            raise ValueError(f"GaussianDropout rate must be in [0, 1); got {rate!r}.")
        super().__init__(rate, seed=seed, **kwargs)

    def call(self, inputs, training=False):
        if not (training and self.rate > 0 and distribute.distributed(self)):
            return super().call(inputs, training=training)
        x = tf.convert_to_tensor(inputs)
        return x * draw_as_one_device(
            self,
            x,
            lambda shape: keras.random.normal(
                shape,
                mean=1.0,
                stddev=math.sqrt(self.rate / (1.0 - self.rate)),
                dtype=self.compute_dtype,
                seed=self.seed_generator,
            ),
        )
