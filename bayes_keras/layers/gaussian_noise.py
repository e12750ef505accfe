"""GaussianNoise drawn independently for every particle, and under tf.distribute as one device draws it."""

import keras
import tensorflow as tf

from bayes_keras.training import distribute
from bayes_keras._config import check_number
from bayes_keras.layers._random import draw_as_one_device


@keras.saving.register_keras_serializable(package="bayes_keras")
class GaussianNoise(keras.layers.GaussianNoise):
    """`keras.layers.GaussianNoise` (additive N(0, stddev^2) noise, in training only) on (batch, N, ...) activations
    or, before the first particle layer, on (batch, ...) inputs. Under tf.distribute the noise is drawn for the
    global batch (and every particle) and each replica keeps its part, so training equals one device's.

    Example:
        >>> x = bayes_keras.layers.GaussianNoise(0.1)(inputs)   # input noise, drawn per example
    """

    receives_particles = True  # set by BayesianModel from the model's graph
    # under tf.distribute (bayes_keras.training.call_checks.random_layers)
    draws_as_one_device = True

    def __init__(self, stddev, seed=None, **kwargs):
        stddev = check_number(stddev, "GaussianNoise stddev", allow_zero=True)
        super().__init__(stddev, seed=seed, **kwargs)

    def call(self, inputs, training=False):
        if not (training and self.stddev > 0 and distribute.distributed(self)):
            return super().call(inputs, training=training)
        x = tf.convert_to_tensor(inputs)
        return x + draw_as_one_device(
            self,
            x,
            lambda shape: keras.random.normal(
                shape,
                mean=0.0,
                stddev=self.stddev,
                dtype=self.compute_dtype,
                seed=self.seed_generator,
            ),
        )
