"""Bidirectional wrapper for the particle RNN layers (the particle axis is kept)."""

import copy

import keras
import tensorflow as tf

from bayes_keras.layers._recurrent import _ParticleRNN

_MERGE_MODES = ("concat", "sum", "ave", "mul")


@keras.saving.register_keras_serializable(package="bayes_keras")
class Bidirectional(keras.layers.Layer):
    """`keras.layers.Bidirectional` for `bayes_keras.layers.SimpleRNN`, `LSTM` and `GRU`.

    As in Keras, the forward layer is a fresh copy of `layer` (named "forward_<name>") and the
    backward layer a copy with `go_backwards=True` ("backward_<name>") unless `backward_layer` is
    given; both carry their own (N, ...) particle weights (and priors), and the model finds them as
    particle layers. With return_sequences the backward outputs are flipped back to input order
    before merging. Input (batch, T, F) when the wrapped layer starts the particle axis
    (`num_particles=N`), else (batch, N, T, F); output (batch, N, [T,] units) with the last axis
    doubled for merge_mode="concat".

    Args:
        layer: a bayes_keras particle RNN layer with go_backwards=False.
        merge_mode: "concat" (default), "sum", "ave" or "mul" (Keras' None, two outputs, is not
            supported: a BayesianModel has one output).
        backward_layer: optional particle RNN layer with go_backwards=True, the same
            return_sequences and the same num_particles as `layer`.

    Example:
        >>> inputs = keras.Input((8, 8))
        >>> h = bayes_keras.layers.Bidirectional(bayes_keras.layers.GRU(16, num_particles=10))(inputs)
        >>> logits = bayes_keras.layers.Dense(10)(h)           # h: (batch, 10, 32)
    """

    def __init__(self, layer, merge_mode="concat", weights=None, backward_layer=None, **kwargs):
        if not isinstance(layer, _ParticleRNN):
            raise ValueError(
                "bayes_keras.layers.Bidirectional wraps a bayes_keras particle RNN layer (SimpleRNN, "
                f"LSTM, GRU); got {layer!r}. Use keras.layers.Bidirectional for Keras layers."
            )
        if merge_mode not in _MERGE_MODES:
            raise ValueError(
                f"Bidirectional merge_mode must be one of {_MERGE_MODES}; got {merge_mode!r}."
            )
        if weights is not None:
            raise ValueError(
                "bayes_keras.layers.Bidirectional does not support weights=; set the sublayers' weights."
            )
        if layer.go_backwards:
            raise ValueError(
                "Bidirectional needs a forward layer (go_backwards=False); the backward copy is made "
                "from it."
            )
        super().__init__(**kwargs)
        self.supports_masking = True
        self.forward_layer = self._copy(layer, "forward", go_backwards=False)
        if backward_layer is None:
            self.backward_layer = self._copy(layer, "backward", go_backwards=True)
        else:
            if not isinstance(backward_layer, _ParticleRNN):
                raise ValueError(
                    f"Bidirectional backward_layer must be a bayes_keras particle RNN layer; got "
                    f"{backward_layer!r}."
                )
            for attr, want in (
                ("go_backwards", True),
                ("return_sequences", layer.return_sequences),
                ("_given_num_particles", layer._given_num_particles),
            ):
                if getattr(backward_layer, attr) != want:
                    raise ValueError(
                        f"Bidirectional backward_layer needs {attr.lstrip('_')}={want!r}; got "
                        f"{getattr(backward_layer, attr)!r}."
                    )
            self.backward_layer = backward_layer
        self.merge_mode = merge_mode
        self.return_sequences = layer.return_sequences

    @staticmethod
    def _copy(layer, prefix, go_backwards):
        config = copy.deepcopy(layer.get_config())
        base = layer.name
        for p in ("forward_", "backward_"):
            if base.startswith(p):
                base = base[len(p) :]
        config["name"] = f"{prefix}_{base}"
        config["go_backwards"] = go_backwards
        return layer.__class__.from_config(config)

    def build(self, input_shape):
        if not self.forward_layer.built:
            self.forward_layer.build(input_shape)
        if not self.backward_layer.built:
            self.backward_layer.build(input_shape)

    def call(self, inputs, mask=None):
        # in this layer's compute dtype, as Keras' Bidirectional (the wrapped layers keep their own policy)
        y = tf.cast(self.forward_layer(inputs, mask=mask), self.compute_dtype)
        y_rev = tf.cast(self.backward_layer(inputs, mask=mask), self.compute_dtype)
        if self.return_sequences:
            y_rev = tf.reverse(y_rev, [2])  # (batch, N, T, units): time is axis 2
        if self.merge_mode == "concat":
            return tf.concat([y, y_rev], axis=-1)
        if self.merge_mode == "sum":
            return y + y_rev
        if self.merge_mode == "ave":
            return (y + y_rev) / 2
        return y * y_rev

    def compute_mask(self, inputs, mask=None):
        return mask if self.return_sequences else None

    def compute_output_shape(self, input_shape):
        shape = list(self.forward_layer.compute_output_shape(input_shape))
        if self.merge_mode == "concat":
            shape[-1] = shape[-1] + self.backward_layer.units
        return tuple(shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "layer": keras.saving.serialize_keras_object(self.forward_layer),
                "merge_mode": self.merge_mode,
                "backward_layer": keras.saving.serialize_keras_object(self.backward_layer),
            }
        )
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = copy.deepcopy(config)
        config["layer"] = keras.saving.deserialize_keras_object(
            config["layer"], custom_objects=custom_objects
        )
        if config.get("backward_layer") is not None:
            config["backward_layer"] = keras.saving.deserialize_keras_object(
                config["backward_layer"], custom_objects=custom_objects
            )
        return cls(**config)
