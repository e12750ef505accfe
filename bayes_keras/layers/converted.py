"""Converted: a user's custom layer whose weight sublayers are particle twins (made by bayesianize)."""

import keras
import tensorflow as tf

# keras.src: the tensors' Keras masks have no public accessors
from keras.src.backend import get_keras_mask, set_keras_mask

from bayes_keras.layers.particle_layout import particle_axis
from bayes_keras.layers.einsum_dense import EinsumDense
from bayes_keras.layers.lora_einsum_dense import LoRAEinsumDense
from bayes_keras.layers.multi_head_attention import MultiHeadAttention
from bayes_keras.layers.per_particle import (
    fold_mask,
    fold_particles,
    repeat_examples,
    unfold_particles,
)

# twins whose particle axis follows the batch axis at every rank (einsum equations), not only below image rank
_LEADING_PARTICLES = (EinsumDense, LoRAEinsumDense, MultiHeadAttention)


def _parent_and_key(root, path):
    """The object holding `path`'s last component ("att", "blocks.1", "inner.ffn") and that component."""
    *parents, last = path.split(".")
    node = root
    for part in parents:
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node, last


def get_sublayer(root, path):
    node, key = _parent_and_key(root, path)
    return node[int(key)] if key.isdigit() else getattr(node, key)


def set_sublayer(root, path, value):
    node, key = _parent_and_key(root, path)
    old = node[int(key)] if key.isdigit() else getattr(node, key, None)
    tracker = getattr(node, "_tracker", None)  # Keras' attribute tracker (no public API reaches it)
    if (
        tracker is not None
        and tracker.locked
        and isinstance(old, keras.layers.Layer)
        and tracker.is_in_store("layers", old)
    ):
        # a layer built in its constructor (KerasHub's TransformerDecoder, given its input shapes) refuses new
        # sublayers: the twin takes the old one's place in the tracker (and so in the weight order), as Keras' own
        # layers change their state after build (enable_lora unlocks the tracker)
        tracker.replace_tracked_value("layers", old, value)
    if key.isdigit():
        node[int(key)] = value
    else:
        setattr(node, key, value)


@keras.saving.register_keras_serializable(package="bayes_keras")
class Batchless(keras.layers.Layer):
    """Runs a particle layer that starts the particle axis on a tensor without a batch axis (the keras.io
    position embedding's `ops.arange(maxlen)`): (T, ...) -> (N, T, ...), which broadcasts against the
    (batch, N, T, ...) activations it is added to."""

    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        self.layer = (
            keras.saving.deserialize_keras_object(layer) if isinstance(layer, dict) else layer
        )

    def call(self, inputs):
        return self.layer(inputs[None])[0]

    def compute_output_shape(self, input_shape):
        return tuple(self.layer.compute_output_shape((1,) + tuple(input_shape)))[1:]

    def get_config(self):
        return {**super().get_config(), "layer": keras.saving.serialize_keras_object(self.layer)}


@keras.saving.register_keras_serializable(package="bayes_keras")
class Converted(keras.layers.Layer):
    """A custom layer (a Python `call` over Keras sublayers, such as the keras.io TransformerBlock) whose weight
    sublayers were replaced by particle twins, so that its call runs every particle at once.

    `bayesianize` makes it, and checks on random inputs that each particle of the result computes what the
    custom layer computes on that particle's input before accepting it. Its floating-point inputs without a
    particle axis are repeated for every particle before the call (integer inputs, token ids, go to the
    embedding twins as they are); `twins` maps attribute paths ("att", "ffn", "blocks.1") to the twin
    layers, which replace the custom layer's own sublayers of those names, also when the model is loaded.

    A custom layer whose own operations read the particle axis as one of its axes (KerasHub's TransformerDecoder
    takes the sequence length from axis 1 for its causal mask) runs `folded`: its call sees every particle as an
    example of one batch of B*N ((B, N, T, F) -> (B*N, T, F), inputs without particles repeated), and each twin
    unfolds its arguments to the particle layout, computes every particle at once, and folds its result again.

    Args:
        layer: the custom layer (an instance, or its serialized form).
        twins: {attribute path: particle layer (or its serialized form)}.
        particle_inputs: one entry per tensor in the call's flattened arguments: True where it carries the
            particle axis, False where it is repeated for every particle, None where it is passed as it is.
        num_particles: N.
        built_parts: what the custom layer's build() makes, which a copy from its config lacks ({attribute:
            sublayer or plain value}): set on the copy, which is then never built (build would make its sublayers
            again, over the twins).
        folded: run the custom layer's call on the folded batch (above).
    """

    def __init__(
        self, layer, twins, particle_inputs, num_particles, built_parts=None, folded=False, **kwargs
    ):
        super().__init__(**kwargs)
        deserialize = keras.saving.deserialize_keras_object
        # unbuilt, so that its sublayers can be replaced (the twins build on call)
        if isinstance(layer, dict):
            layer = deserialize({k: v for k, v in layer.items() if k != "build_config"})
        self.layer = layer
        # what the layer's build() makes (its sublayers, plain values): given here, so that build() never runs
        # (it would make the sublayers again, over the twins); kept serialized, for get_config
        top = {path.split(".")[0] for path in twins}
        self.built_parts = {
            name: keras.saving.serialize_keras_object(v) if isinstance(v, keras.layers.Layer) else v
            for name, v in (built_parts or {}).items()
            if name not in top
        }
        for name, value in self.built_parts.items():
            setattr(
                self.layer,
                name,
                deserialize(value) if isinstance(value, dict) and "class_name" in value else value,
            )
        if built_parts:
            self.layer.built = True
        self.twins = {
            path: deserialize(t) if isinstance(t, dict) else t for path, t in twins.items()
        }
        self.particle_inputs = list(particle_inputs)
        self.num_particles = int(num_particles)
        self.folded = bool(folded)
        # its inputs' masks pass on as the custom layer's do
        self.supports_masking = self.layer.supports_masking
        for path, twin in self.twins.items():
            set_sublayer(
                self.layer, path, _Unfolding(twin, self.num_particles) if self.folded else twin
            )

    def build(self, *args, **kwargs):
        pass  # the twins build on their first call, inside the custom layer's call

    def _with_particles(self, tensor, carries):
        if carries is not False:
            return tensor
        tensor = tf.convert_to_tensor(tensor)
        axis = particle_axis(len(tensor.shape) + 1)
        tensor = tf.expand_dims(tensor, axis)
        multiples = [1] * len(tensor.shape)
        multiples[axis] = self.num_particles
        return tf.tile(tensor, multiples)

    def _folded(self, tensor, carries):
        mask = get_keras_mask(tensor)
        folded = (
            fold_particles(tensor)
            if carries
            else repeat_examples(tf.convert_to_tensor(tensor), self.num_particles)
        )
        # the padding mask an Embedding set, which the custom layer's sublayers read
        if mask is not None:
            set_keras_mask(folded, fold_mask(mask, tensor, carries, self.num_particles))
        return folded

    def call(self, *args, **kwargs):
        flat = keras.tree.flatten((args, kwargs))
        tensors = iter(self.particle_inputs)
        prepare = self._folded if self.folded else self._with_particles
        flat = [prepare(x, next(tensors)) if _is_tensor(x) else x for x in flat]
        args, kwargs = keras.tree.pack_sequence_as((args, kwargs), flat)
        outputs = self.layer(*args, **kwargs)
        if not self.folded:
            return outputs
        return keras.tree.map_structure(
            lambda y: unfold_particles(y, self.num_particles) if _is_tensor(y) else y, outputs
        )

    def get_config(self):
        return {
            **super().get_config(),
            "layer": keras.saving.serialize_keras_object(self.layer),
            "twins": {
                path: keras.saving.serialize_keras_object(t) for path, t in self.twins.items()
            },
            "particle_inputs": self.particle_inputs,
            "num_particles": self.num_particles,
            "built_parts": dict(self.built_parts),
            "folded": self.folded,
        }


class _Unfolding(keras.layers.Layer):
    """A twin inside a folded Converted layer: its tensor arguments (B*N, ...) (and their Keras masks) are unfolded
    to the particle layout, the twin computes every particle at once, and its results are folded back."""

    def __init__(self, layer, num_particles, **kwargs):
        super().__init__(name=f"{layer.name}_unfolding", dtype=layer.dtype_policy, **kwargs)
        self.layer = layer
        self.num_particles = num_particles

    def __getattr__(self, name):
        # the custom layer's call may read its sublayer's attributes (`self.attention.num_heads`): the twin's
        layer = self.__dict__.get("layer")
        if layer is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(layer, name)

    def _unfold(self, x):
        if not _is_tensor(x):
            return x
        mask = get_keras_mask(x)
        x = tf.convert_to_tensor(x)
        if not x.shape.rank or (x.shape[0] == 1 and self.num_particles > 1):
            # a scalar, or one row that broadcasts over the batch (a causal mask (1, T, T))
            return x
        if isinstance(self.layer, _LEADING_PARTICLES):
            y = tf.reshape(x, tf.concat([[-1, self.num_particles], tf.shape(x)[1:]], 0))
            y.set_shape([None, self.num_particles] + list(x.shape[1:]))
        else:
            y = unfold_particles(x, self.num_particles)
        if mask is not None:
            set_keras_mask(y, self._unfold(mask))
        return y

    def _fold(self, y):
        if not _is_tensor(y):
            return y
        mask = get_keras_mask(y)
        if isinstance(self.layer, _LEADING_PARTICLES):
            folded = tf.reshape(y, tf.concat([[-1], tf.shape(y)[2:]], 0))
        else:
            folded = fold_particles(y)
        # the twin's output mask (attention keeps its query's), on the folded batch
        if mask is not None:
            set_keras_mask(
                folded,
                self._fold(mask)
                if len(mask.shape) == len(y.shape) - 1
                else repeat_examples(mask, self.num_particles),
            )
        return folded

    def call(self, *args, **kwargs):
        args, kwargs = keras.tree.map_structure(self._unfold, (args, kwargs))
        return keras.tree.map_structure(self._fold, self.layer(*args, **kwargs))


def _is_tensor(x):
    return (
        isinstance(x, (tf.Tensor, tf.Variable, keras.KerasTensor))
        or hasattr(x, "__array__")
        and hasattr(x, "shape")
    )
