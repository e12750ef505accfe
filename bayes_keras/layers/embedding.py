"""Embedding with one lookup table per particle."""

import keras
import tensorflow as tf

from bayes_keras.curvature import capture, rules
from bayes_keras.layers.base import ParticleLayer


def checked_ids(layer, inputs):
    """`inputs` as int32 token ids, asserted to lie in [0, layer.input_dim): an id outside the table would be a
    GatherV2 error on CPU and a silent zero vector on GPU."""
    ids = tf.cast(inputs, tf.int32)
    name = f"{type(layer).__name__} '{layer.name}'"
    with tf.control_dependencies(
        [
            tf.debugging.assert_non_negative(ids, message=f"{name}: token ids must be >= 0"),
            tf.debugging.assert_less(
                ids,
                layer.input_dim,
                message=f"{name}: token ids must be "
                f"< input_dim={layer.input_dim} (the vocabulary size, + 1 with mask_zero)",
            ),
        ]
    ):
        return tf.identity(ids)


@keras.saving.register_keras_serializable(package="bayes_keras")
class Embedding(ParticleLayer):
    """Token embedding whose table is an (N, input_dim, output_dim) stack of particles: integer inputs
    (batch, ...) -> (batch, N, ..., output_dim). It starts the particle axis (give it `num_particles`), or
    with `deterministic=True` shares one table and broadcasts it to the particles.

    `mask_zero=True` treats index 0 as padding and passes a (batch, ...) mask on, which the particle
    recurrent layers and GlobalAveragePooling1D honour (as Keras' do); the table then needs
    input_dim = vocabulary size + 1, as in Keras.

    Further arguments:

    - input_dim, output_dim, embeddings_initializer, mask_zero: as in `keras.layers.Embedding`.
    - num_particles, deterministic: see `ParticleLayer`.

    Args:
        embeddings_prior: prior of the table entries (default N(0, 1)).

    Example:
        >>> tokens = keras.Input((None,), dtype="int32")
        >>> h = bayes_keras.layers.Embedding(1000, 32, mask_zero=True, num_particles=8)(tokens)
        >>> h = bayes_keras.layers.GRU(32)(h)                     # masked steps are skipped
        >>> logits = bayes_keras.layers.Dense(2)(h)
    """

    curvature_rules = rules.EMBEDDING  # KFAC and squared-gradient formulas (curvature/rules.py)

    def __init__(
        self,
        input_dim,
        output_dim,
        embeddings_initializer="uniform",
        mask_zero=False,
        embeddings_prior=None,
        **kwargs,
    ):
        kwargs.setdefault("kernel_prior", embeddings_prior)
        super().__init__(**kwargs)
        for name, value in (("input_dim", input_dim), ("output_dim", output_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Embedding {name} must be a positive integer; got {value!r}.")
        if self._given_num_particles is None and not self.deterministic:
            raise ValueError(
                "Embedding reads token indices, which have no particle axis: pass num_particles=N "
                "(it starts the particle axis), or deterministic=True for a shared table."
            )
        self.input_dim, self.output_dim = input_dim, output_dim
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.mask_zero = bool(mask_zero)
        self.supports_masking = self.mask_zero

    def build(self, input_shape):
        self.embeddings = self.add_particle_weight(
            "embeddings",
            (self.input_dim, self.output_dim),
            self.embeddings_initializer,
            self.kernel_prior,
            self.input_dim,
        )

    def call(self, inputs):
        ids = checked_ids(self, inputs)
        if self.deterministic:
            out = tf.gather(self.embeddings, ids)  # (batch, ..., D)
            return self._broadcast_shared(out) if self.broadcasts else out
        # (batch, N, ..., D)
        out = tf.experimental.numpy.moveaxis(tf.gather(self.embeddings, ids, axis=1), 0, 1)
        # a Dense layer on one-hot ids: the output is the pre-activation
        capture.record(self, ids, out)
        return out

    def compute_mask(self, inputs, mask=None):
        return keras.ops.not_equal(inputs, 0) if self.mask_zero else None

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        if not self.deterministic or self.broadcasts:
            shape = shape[:1] + [self._given_num_particles] + shape[1:]
        return tuple(shape + [self.output_dim])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "input_dim": self.input_dim,
                "output_dim": self.output_dim,
                "mask_zero": self.mask_zero,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
