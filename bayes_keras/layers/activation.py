"""Elementwise activation; works on any layout, so the particle axis passes through."""

import keras


@keras.saving.register_keras_serializable(package="bayes_keras")
class Activation(keras.layers.Activation):
    """`keras.layers.Activation`, registered here so particle models read as one vocabulary.

    Example:
        >>> h = bayes_keras.layers.Activation("relu")(h)
    """
