"""Global pooling layers that keep the particle axis: (batch, N, T, C) sequences and (batch, H, W, N, C) images
to (batch, N, C)."""

import keras
import tensorflow as tf


class _ParticleGlobalPooling(keras.layers.Layer):
    """Pools sequences (batch, N, T, C) over T, or images (batch, H, W, N, C) over H and W, particle by particle."""

    _spatial_rank = None
    _reduce = None  # staticmethod(tf.reduce_mean or tf.reduce_max)

    def __init__(self, data_format=None, keepdims=False, **kwargs):
        super().__init__(**kwargs)
        if data_format not in (None, "channels_last"):
            raise ValueError(
                f"{type(self).__name__} supports data_format='channels_last' only; got {data_format!r}."
            )
        self.keepdims = bool(keepdims)
        self.supports_masking = self._spatial_rank == 1

    def _axes(self, inputs):
        rank = self._spatial_rank + 3
        if len(inputs.shape) != rank:
            layout = (
                "(batch, particles, steps, channels)"
                if rank == 4
                else "(batch, H, W, particles, channels)"
            )
            raise ValueError(
                f"{type(self).__name__} expects {layout} from a particle layer; got shape "
                f"{tuple(inputs.shape)}."
            )
        return [2] if rank == 4 else [1, 2]

    def call(self, inputs):
        return self._reduce(inputs, axis=self._axes(inputs), keepdims=self.keepdims)

    def compute_output_shape(self, input_shape):
        if self._spatial_rank == 1:
            n, kept = input_shape[1], (input_shape[0], input_shape[1], 1, input_shape[-1])
        else:
            n, kept = input_shape[3], (input_shape[0], 1, 1, input_shape[3], input_shape[-1])
        return kept if self.keepdims else (input_shape[0], n, input_shape[-1])

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
        # (B, [N,] T) -> broadcast
        mask = mask[:, None, :, None] if len(mask.shape) == 2 else mask[..., None]
        total = tf.reduce_sum(inputs * mask, axis=axes, keepdims=self.keepdims)
        return total / tf.reduce_sum(mask, axis=axes, keepdims=self.keepdims)


@keras.saving.register_keras_serializable(package="bayes_keras")
class GlobalAveragePooling2D(_ParticleGlobalPooling):
    """`keras.layers.GlobalAveragePooling2D` per particle: (batch, H, W, N, C) -> (batch, N, C).

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
    """`keras.layers.GlobalMaxPooling2D` per particle: (batch, H, W, N, C) -> (batch, N, C).

    Example:
        >>> h = bayes_keras.layers.GlobalMaxPooling2D()(h)
    """

    _spatial_rank = 2
    _reduce = staticmethod(tf.reduce_max)
