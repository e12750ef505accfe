"""AlphaDropout drawn independently for every particle, and under tf.distribute as one device draws it."""

import keras
import tensorflow as tf

from bayes_keras.training import distribute
from bayes_keras._config import check_number
from bayes_keras.layers._random import draw_as_one_device

# -alpha * scale of SELU
_ALPHA_P = -1.6732632423543772848170429916717 * 1.0507009873554804934193349852946


@keras.saving.register_keras_serializable(package="bayes_keras")
class AlphaDropout(keras.layers.AlphaDropout):
    """`keras.layers.AlphaDropout` (dropout that keeps a SELU network's mean and variance, from "Self-Normalizing
    Neural Networks", https://arxiv.org/abs/1706.02515; in training only) on (batch, N, ...) activations: dropped
    units are set to -alpha * scale, then x -> a x + b with a = ((1 - p)(1 + p alpha_p^2))^(-1/2), b = -a alpha_p p.
    Under tf.distribute the mask is drawn for the global batch and every particle and each replica keeps its part,
    so training equals one device's.

    Example:
        >>> h = bayes_keras.layers.AlphaDropout(0.1)(h)
    """

    receives_particles = True  # set by BayesianModel from the model's graph
    # under tf.distribute (bayes_keras.training.call_checks.random_layers)
    draws_as_one_device = True

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        rate = check_number(rate, "AlphaDropout rate", positive=False)
        super().__init__(rate, noise_shape=noise_shape, seed=seed, **kwargs)

    def call(self, inputs, training=False):
        if not (training and self.rate > 0 and distribute.distributed(self)):
            return super().call(inputs, training=training)
        x = tf.convert_to_tensor(inputs)
        kept = draw_as_one_device(
            self,
            x,
            lambda shape: tf.cast(
                keras.random.uniform(shape, seed=self.seed_generator) >= self.rate, x.dtype
            ),
            self.noise_shape,
        )
        a = ((1 - self.rate) * (1 + self.rate * _ALPHA_P**2)) ** -0.5
        return a * (x * kept + _ALPHA_P * (1 - kept)) - a * _ALPHA_P * self.rate
