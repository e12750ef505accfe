"""Dropout whose mask is drawn independently for every particle."""

import keras


@keras.saving.register_keras_serializable(package="bayes_keras")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` on (batch, N, ...): each particle gets its own mask (active in training only).

    Example:
        >>> h = bayes_keras.layers.Dropout(0.25)(h)
    """
