"""Dropout whose mask is drawn independently for every particle."""

import keras


@keras.saving.register_keras_serializable(package="bayes_keras")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` on (batch, N, ...): each particle gets its own mask (active in training only).

    Example:
        >>> h = bayes_keras.layers.Dropout(0.25)(h)
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        if isinstance(rate, bool):
            raise ValueError(f"Dropout rate must be a number in [0, 1); got {rate!r}.")
        super().__init__(rate, noise_shape=noise_shape, seed=seed, **kwargs)
