"""LoRAEmbedding: a frozen embedding table shared by all particles plus rank-r factors per particle."""

import keras
import tensorflow as tf

from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.embedding import checked_ids


@keras.saving.register_keras_serializable(package="bayes_keras")
class LoRAEmbedding(ParticleLayer):
    """Bayesian LoRA for `keras.layers.Embedding`: the table E is frozen, stored once and shared by all
    particles; particle n looks up in E + (lora_alpha / rank) * A_n @ B_n, A_n: (input_dim, rank),
    B_n: (rank, output_dim), as Keras' `Embedding.enable_lora` does for one network. Integer inputs
    (batch, ...) -> (batch, N, ..., output_dim); it starts the particle axis (give it `num_particles`).

    A_n is drawn per particle (`a_initializer`, Keras' he_uniform) and B_n starts near zero (N(0, 0.01^2) per
    particle; Keras' zeros would make every particle's update zero). Reference: Hu et al., "LoRA: Low-Rank
    Adaptation of Large Language Models", https://arxiv.org/abs/2106.09685.

    Further arguments:

    - input_dim, output_dim, embeddings_initializer, mask_zero: as in `keras.layers.Embedding`.
    - rank, lora_alpha, a_initializer, b_initializer: as in `LoRAEinsumDense`.
    - num_particles, deterministic, kernel_prior: see `ParticleLayer` (`kernel_prior`: the factors' prior).


    Example:
        >>> tokens = keras.Input((None,), dtype="int32")
        >>> h = bayes_keras.layers.LoRAEmbedding(1000, 32, rank=4, num_particles=8)(tokens)   # (batch, 8, T, 32)
    """

    def __init__(
        self,
        input_dim,
        output_dim,
        rank,
        lora_alpha=None,
        embeddings_initializer="uniform",
        mask_zero=False,
        a_initializer="he_uniform",
        b_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("input_dim", input_dim), ("output_dim", output_dim), ("rank", rank)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LoRAEmbedding {name} must be a positive integer; got {value!r}.")
        if lora_alpha is not None and (
            isinstance(lora_alpha, bool)
            or not isinstance(lora_alpha, (int, float))
            or not lora_alpha > 0
        ):
            raise ValueError(
                f"LoRAEmbedding lora_alpha must be a positive number or None; got {lora_alpha!r}."
            )
        if self._given_num_particles is None:
            raise ValueError(
                "LoRAEmbedding reads token indices, which have no particle axis: pass num_particles=N."
            )
        self.input_dim, self.output_dim, self.rank = input_dim, output_dim, rank
        self.lora_alpha = rank if lora_alpha is None else lora_alpha
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.a_initializer = keras.initializers.get(a_initializer)
        if b_initializer is None:
            b_initializer = (
                "zeros" if self.deterministic else keras.initializers.RandomNormal(stddev=0.01)
            )
        self.b_initializer = keras.initializers.get(b_initializer)
        self.mask_zero = bool(mask_zero)
        self.supports_masking = self.mask_zero

    @property
    def scale(self):
        return self.lora_alpha / self.rank

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.input_dim, self.output_dim),
            initializer=self.embeddings_initializer,
            trainable=False,
        )
        self.lora_embeddings_a = self.add_particle_weight(
            "lora_embeddings_a",
            (self.input_dim, self.rank),
            self.a_initializer,
            self.kernel_prior,
            self.input_dim,
        )
        self.lora_embeddings_b = self.add_particle_weight(
            "lora_embeddings_b",
            (self.rank, self.output_dim),
            self.b_initializer,
            self.kernel_prior,
            self.rank,
        )

    def call(self, inputs):
        ids = checked_ids(self, inputs)
        base = tf.gather(self.embeddings, ids)  # (batch, ..., D), once
        scale = tf.cast(self.scale, base.dtype)
        if self.deterministic:
            table = tf.matmul(self.lora_embeddings_a, self.lora_embeddings_b)
            out = base + scale * tf.gather(table, ids)
            out = tf.expand_dims(out, 1)
            return tf.tile(out, [1, self._given_num_particles] + [1] * (len(out.shape) - 2))
        # (B, N, ..., r)
        low = tf.experimental.numpy.moveaxis(tf.gather(self.lora_embeddings_a, ids, axis=1), 0, 1)
        update = tf.einsum("bn...r,nrd->bn...d", low, self.lora_embeddings_b)
        return tf.expand_dims(base, 1) + scale * update

    def compute_mask(self, inputs, mask=None):
        return keras.ops.not_equal(inputs, 0) if self.mask_zero else None

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        return tuple(shape[:1] + [self._given_num_particles] + shape[1:] + [self.output_dim])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "input_dim": self.input_dim,
                "output_dim": self.output_dim,
                "rank": self.rank,
                "lora_alpha": self.lora_alpha,
                "mask_zero": self.mask_zero,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "a_initializer": keras.initializers.serialize(self.a_initializer),
                "b_initializer": keras.initializers.serialize(self.b_initializer),
            }
        )
        return config
