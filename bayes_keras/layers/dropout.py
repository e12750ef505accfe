"""Dropout whose mask is drawn independently for every particle."""

import keras

from bayes_keras._config import check_number


@keras.saving.register_keras_serializable(package="bayes_keras")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` on (batch, N, ...): each particle gets its own mask (active in training only).

    Example:
        >>> h = bayes_keras.layers.Dropout(0.25)(h)
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        rate = check_number(rate, "Dropout rate", positive=False)
        super().__init__(rate, noise_shape=noise_shape, seed=seed, **kwargs)
