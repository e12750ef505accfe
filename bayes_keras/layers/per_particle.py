"""PerParticle: run any per-example Keras layer on each particle's activations."""

import inspect

import keras
import tensorflow as tf

# keras.src: the tensors' Keras masks have no public accessors
from keras.src.backend import set_keras_mask

from bayes_keras.layers.particle_layout import IMAGE_RANK, all_known, particle_axis


def fold_particles(x):
    """A particle activation -> one batch of B*N examples in the ordinary Keras layout: (B, N, ...) ->
    (B*N, ...) (row b*N + n is particle n of example b); images (B, H, W, N, C) -> (B*N, H, W, C)."""
    if len(x.shape) == IMAGE_RANK:
        x = tf.transpose(x, [0, 3, 1, 2, 4])
    if all_known(x.shape[1:]):  # a static target shape: one op in eager code
        return tf.reshape(x, (-1,) + tuple(x.shape[2:]))
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))


def unfold_particles(y, num_particles):
    """Inverse of `fold_particles` for a result of the folded batch: (B*N, ...) -> (B, N, ...), and to the
    image layout (B, H, W, N, C) when the per-example result is an image (B*N, H, W, C)."""
    if all_known(y.shape[1:]):
        y = tf.reshape(y, (-1, num_particles) + tuple(y.shape[1:]))
    else:
        shape = tf.shape(y)
        y = tf.reshape(y, tf.concat([[shape[0] // num_particles, num_particles], shape[1:]], 0))
    if len(y.shape) == IMAGE_RANK:
        y = tf.transpose(y, [0, 2, 3, 1, 4])
    return y


def repeat_examples(x, num_particles):
    """An input without the particle axis, (B, ...), as the folded batch sees it: each row N times."""
    return tf.repeat(x, num_particles, axis=0)


def fold_mask(mask, x, carries, num_particles):
    """The Keras mask of input `x` as the folded batch sees it. A mask with the particle axis is (B, N, T) for a
    (B, N, T, F) input; one without it ((B, T), from an Embedding before the particle layers) is the same for
    every particle."""
    if (
        carries
        and len(x.shape) != IMAGE_RANK
        and len(mask.shape) == len(x.shape) - 1
        and mask.shape[1] == num_particles
    ):
        return fold_particles(mask)
    return repeat_examples(mask, num_particles)


@keras.saving.register_keras_serializable(package="bayes_keras")
class PerParticle(keras.layers.Layer):
    """Applies a Keras layer to every particle's activations as if they were separate examples.

    The particle axis is folded into the batch ((batch, N, ...) -> (batch * N, ...); particle images
    (batch, H, W, N, C) -> (batch * N, H, W, C)), `layer` runs on that batch in Keras' ordinary layout, and
    its result is unfolded again. So any layer that treats the examples of a batch independently (Keras'
    layers do, except BatchNormalization in training) acts on each particle separately, with its axis
    arguments meaning what they mean in a plain Keras model: `PerParticle(keras.layers.Softmax(axis=1))`
    on (batch, N, T, 1) is a softmax over T for each particle. Inputs without a particle axis (marked in
    `particle_inputs`) are repeated for every particle; masks are folded with their inputs. `layer`'s
    weights, if any, are shared by all particles: point estimates without a prior (maximum likelihood,
    or penalised by the wrapped layer's Keras regularizers), unlike a `deterministic=True` particle layer's.

    `bayes_keras.bayesianize` wraps the layers of a converted model that have no particle version in
    this; build it yourself around a per-example layer the mixing guard cannot vouch for (a custom layer,
    a Reshape, attention over time).

    Args:
        layer: a Keras layer written for ordinary (batch, ...) tensors.
        particle_inputs: for a layer with several inputs, one bool per (flattened) input: True where it
            carries the particle axis. Default: every input does.
        unpack: call `layer` with the inputs as separate positional arguments (`layer(query, value)` for
            keras.layers.MultiHeadAttention) instead of one list.

    Example:
        >>> h = bayes_keras.layers.Dense(8, num_particles=10)(keras.Input((20, 4)))   # (batch, 10, 20, 8)
        >>> w = bayes_keras.layers.Dense(1)(h)
        >>> w = bayes_keras.layers.PerParticle(keras.layers.Softmax(axis=1))(w)      # over the 20 steps
    """

    def __init__(self, layer, particle_inputs=None, unpack=False, **kwargs):
        if isinstance(layer, dict):
            layer = keras.saving.deserialize_keras_object(layer)
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError(f"PerParticle wraps a Keras layer; got {layer!r}.")
        kwargs.setdefault("name", f"per_particle_{layer.name}")
        super().__init__(**kwargs)
        self.layer = layer
        if particle_inputs is not None:
            particle_inputs = [bool(f) for f in particle_inputs]
            if not any(particle_inputs):
                raise ValueError(
                    "PerParticle: at least one input must carry the particle axis; got "
                    f"particle_inputs={particle_inputs}."
                )
        self.particle_inputs = particle_inputs
        self.unpack = bool(unpack)
        self.supports_masking = True
        self._parameters = set(inspect.signature(layer.call).parameters)

    def _flags(self, flat):
        flags = self.particle_inputs or [True] * len(flat)
        if len(flags) != len(flat):
            raise ValueError(
                f"PerParticle '{self.name}': particle_inputs has {len(flags)} entries for "
                f"{len(flat)} inputs."
            )
        return flags

    def _num_particles(self, shapes, flags):
        ns = {tuple(s)[particle_axis(len(s))] for s, f in zip(shapes, flags) if f}
        if len(ns) != 1 or None in ns:
            raise ValueError(
                f"PerParticle '{self.name}' needs inputs with one known number of particles; got "
                f"shapes {[tuple(s) for s in shapes]}."
            )
        return ns.pop()

    def call(self, inputs, training=None, mask=None):
        flat = keras.tree.flatten(inputs)
        flags = self._flags(flat)
        n = self._num_particles([x.shape for x in flat], flags)
        folded = [fold_particles(x) if f else repeat_examples(x, n) for x, f in zip(flat, flags)]
        kwargs = {}
        if "training" in self._parameters:
            kwargs["training"] = training
        several = isinstance(inputs, (list, tuple))
        masks = list(mask) if isinstance(mask, (list, tuple)) else [mask]
        if any(m is not None for m in masks):
            masks = [
                None if m is None else fold_mask(m, x, f, n) for m, x, f in zip(masks, flat, flags)
            ]
            if "mask" in self._parameters:
                kwargs["mask"] = masks if several else masks[0]
            for name, m in zip(("query_mask", "value_mask", "key_mask"), masks):  # attention layers
                if name in self._parameters:
                    kwargs[name] = m
            # layers that read their inputs' masks (Keras' merge layers)
            for x, m in zip(folded, masks):
                if m is not None:
                    set_keras_mask(x, m)
        if self.unpack:
            outputs = self.layer(*folded, **kwargs)
        else:
            outputs = self.layer(
                keras.tree.pack_sequence_as(inputs, folded) if several else folded[0], **kwargs
            )
        return keras.tree.map_structure(lambda y: unfold_particles(y, n), outputs)

    def compute_mask(self, inputs, mask=None):
        if mask is None or not self.layer.supports_masking:
            return None
        return mask[0] if isinstance(mask, (list, tuple)) else mask

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "layer": keras.saving.serialize_keras_object(self.layer),
                "particle_inputs": self.particle_inputs,
                "unpack": self.unpack,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layer"] = keras.saving.deserialize_keras_object(config["layer"])
        return cls(**config)
