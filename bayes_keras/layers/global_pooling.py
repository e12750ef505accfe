"""Global pooling layers that keep the particle axis."""

import keras
import tensorflow as tf


class _ParticleGlobalPooling(keras.layers.Layer):
    """Pools (batch, N, *spatial, C) over its `_spatial_rank` spatial axes, particle by particle."""

    _spatial_rank = None
    _reduce = None  # staticmethod(tf.reduce_mean or tf.reduce_max)

    def __init__(self, data_format=None, keepdims=False, **kwargs):
        super().__init__(**kwargs)
        if data_format not in (None, "channels_last"):
            raise ValueError(f"{type(self).__name__} supports data_format='channels_last' only; got {data_format!r}.")
        self.keepdims = bool(keepdims)
        self.supports_masking = self._spatial_rank == 1

    def _axes(self, inputs):
        rank = self._spatial_rank + 3
        if len(inputs.shape) != rank:
            raise ValueError(f"{type(self).__name__} expects (batch, particles, {'steps' if rank == 4 else 'H, W'}, "
                             f"channels) from a particle layer; got shape {tuple(inputs.shape)}.")
        return list(range(2, 2 + self._spatial_rank))

    def call(self, inputs):
        return self._reduce(inputs, axis=self._axes(inputs), keepdims=self.keepdims)

    def compute_output_shape(self, input_shape):
        if self.keepdims:
            return tuple(input_shape[:2]) + (1,) * self._spatial_rank + (input_shape[-1],)
        return (input_shape[0], input_shape[1], input_shape[-1])

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.update({"keepdims": self.keepdims})
        return config


@keras.saving.register_keras_serializable(package="bayes_keras")
class GlobalAveragePooling1D(_ParticleGlobalPooling):
    """`keras.layers.GlobalAveragePooling1D` per particle: (batch, N, T, C) -> (batch, N, C).

    A (batch, T) mask (e.g. from `Embedding(mask_zero=True)`) averages over the unmasked steps only, as
    in Keras.

    Example:
        >>> h = bayes_keras.layers.GlobalAveragePooling1D()(h)
    """

    _spatial_rank = 1
    _reduce = staticmethod(tf.reduce_mean)

    def call(self, inputs, mask=None):
        if mask is None:
            return super().call(inputs)
        axes = self._axes(inputs)
        mask = tf.cast(mask, inputs.dtype)
        mask = mask[:, None, :, None] if len(mask.shape) == 2 else mask[..., None]  # (B, [N,] T) -> broadcast
        total = tf.reduce_sum(inputs * mask, axis=axes, keepdims=self.keepdims)
        return total / tf.reduce_sum(mask, axis=axes, keepdims=self.keepdims)


@keras.saving.register_keras_serializable(package="bayes_keras")
class GlobalAveragePooling2D(_ParticleGlobalPooling):
    """`keras.layers.GlobalAveragePooling2D` per particle: (batch, N, H, W, C) -> (batch, N, C).

    Example:
        >>> h = bayes_keras.layers.GlobalAveragePooling2D()(h)
    """

    _spatial_rank = 2
    _reduce = staticmethod(tf.reduce_mean)


@keras.saving.register_keras_serializable(package="bayes_keras")
class GlobalMaxPooling1D(_ParticleGlobalPooling):
    """`keras.layers.GlobalMaxPooling1D` per particle: (batch, N, T, C) -> (batch, N, C).

    Example:
        >>> h = bayes_keras.layers.GlobalMaxPooling1D()(h)
    """

    _spatial_rank = 1
    _reduce = staticmethod(tf.reduce_max)

    def call(self, inputs, mask=None):  # accepts a mask and ignores it (as before)
        return super().call(inputs)


@keras.saving.register_keras_serializable(package="bayes_keras")
class GlobalMaxPooling2D(_ParticleGlobalPooling):
    """`keras.layers.GlobalMaxPooling2D` per particle: (batch, N, H, W, C) -> (batch, N, C).

    Example:
        >>> h = bayes_keras.layers.GlobalMaxPooling2D()(h)
    """

    _spatial_rank = 2
    _reduce = staticmethod(tf.reduce_max)
