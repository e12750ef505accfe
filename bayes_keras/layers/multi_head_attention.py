"""Multi-head attention with one set of query / key / value / output projections per particle."""

import math

import keras
import tensorflow as tf

# keras.src: the tensors' Keras masks have no public accessors
from keras.src.backend import get_keras_mask, set_keras_mask

from bayes_keras import priors as priors_lib
from bayes_keras.layers.dropout import Dropout
from bayes_keras.layers.einsum_dense import EinsumDense
from bayes_keras.layers.lora_einsum_dense import LoRAEinsumDense

# the projections of keras.layers.MultiHeadAttention on (batch, time, features) inputs, written for one particle
_PROJECTION = "abc,cde->abde"
_OUTPUT = "abcd,cde->abe"
_PROJECTIONS = ("query", "key", "value", "gate", "attention_output")


def _large_negative(dtype):
    """What Keras' masked softmax puts at masked positions (-1e9; -3e4 in float16)."""
    return -3e4 if tf.as_dtype(dtype) == tf.float16 else -1e9


@keras.saving.register_keras_serializable(package="bayes_keras")
class MultiHeadAttention(keras.layers.Layer):
    """`keras.layers.MultiHeadAttention` whose query, key, value (and gate) and output projections carry one
    weight set per particle (`bayes_keras.layers.EinsumDense`), attending over time separately for every
    particle and example in one batched computation.

    Inputs (batch, N, T, features) from a previous particle layer, or (batch, T, features) when this layer
    starts the particle axis (`num_particles=N`); query, key and value may differ (cross-attention to an
    encoder output without a particle axis: its projections broadcast it). Output (batch, N, T, output dim).
    Keras' MultiHeadAttention on a (batch, N, T, F) tensor would attend over N and T together; this layer
    attends over T only. Padding masks (the inputs' Keras masks, (batch, T)), `attention_mask` (batch, T, S)
    and `use_causal_mask` apply to every particle; attention dropout draws independently per particle,
    example and head. With `num_particles` or `deterministic` as in `ParticleLayer`; the four projections are
    `query_dense`, `key_dense`, `value_dense` and `output_dense`, as in Keras.

    Further arguments:

    - num_heads, key_dim, value_dim, dropout, use_bias, output_shape, kernel_initializer, use_gate,
      sliding_window, seed: as in `keras.layers.MultiHeadAttention` (attention over the time axis;
      `output_shape` an int or a 1-tuple).
    - num_particles, deterministic, kernel_prior, bias_prior: see `bayes_keras.layers.ParticleLayer`.
    - lora_rank, lora_alpha, lora_projections: Bayesian LoRA (`LoRAEinsumDense`): the projections named in
      `lora_projections` (default query and value, as KerasHub adapts) get rank-`lora_rank` factors per
      particle on frozen shared kernels; the others are frozen and shared, and a projection of an input
      without the particle axis then computes once (the keys: the particle axis starts inside the attention).

    Args:
        bias_initializer: default zeros when deterministic, N(0, 0.01^2) per particle otherwise.

    Example:
        >>> tokens = keras.Input((16, 32))
        >>> h = bayes_keras.layers.MultiHeadAttention(4, 8, num_particles=10)(tokens, tokens)  # (batch, 10, 16, 32)
        >>> h = bayes_keras.layers.MultiHeadAttention(4, 8)(h, h)                              # self-attention again
    """

    draws_as_one_device = True  # its attention dropout is a bayes_keras.layers.Dropout

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        kernel_initializer="glorot_uniform",
        bias_initializer=None,
        use_gate=False,
        sliding_window=None,
        seed=None,
        num_particles=None,
        deterministic=False,
        kernel_prior=None,
        bias_prior=None,
        lora_rank=None,
        lora_alpha=None,
        lora_projections=("query", "value"),
        **kwargs,
    ):
        super().__init__(**kwargs)
        unknown = sorted(set(lora_projections) - set(_PROJECTIONS))
        if unknown or (lora_rank is not None and not lora_projections):
            raise ValueError(
                f"MultiHeadAttention lora_projections must name some of {_PROJECTIONS}; got "
                f"{tuple(lora_projections)!r}."
            )
        for name, value, optional in (
            ("num_heads", num_heads, False),
            ("key_dim", key_dim, False),
            ("lora_rank", lora_rank, True),
            ("value_dim", value_dim, True),
            ("sliding_window", sliding_window, True),
            ("num_particles", num_particles, True),
        ):
            if (value is not None or not optional) and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"MultiHeadAttention {name} must be a positive integer"
                    f"{' or None' if optional else ''}; got {value!r}."
                )
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0.0 <= dropout < 1.0
        ):
            raise ValueError(
                f"MultiHeadAttention dropout must be a number in [0, 1); got {dropout!r}."
            )
        if isinstance(output_shape, (list, tuple)):
            if len(output_shape) != 1:
                raise ValueError(
                    f"MultiHeadAttention output_shape must be an int or a 1-tuple (the output's last "
                    f"axis); got {output_shape!r}."
                )
            output_shape = output_shape[0]
        if output_shape is not None and (
            isinstance(output_shape, bool) or not isinstance(output_shape, int) or output_shape < 1
        ):
            raise ValueError(
                f"MultiHeadAttention output_shape must be a positive integer; got {output_shape!r}."
            )
        if attention_axes is not None and tuple(keras.tree.flatten(attention_axes)) not in (
            (1,),
            (-2,),
        ):
            raise ValueError(
                "bayes_keras.layers.MultiHeadAttention attends over the time axis of (batch, time, "
                f"features) inputs (attention_axes None, 1 or -2); got attention_axes={attention_axes!r}."
            )
        self.num_heads, self.key_dim = num_heads, key_dim
        self.value_dim = value_dim or key_dim
        self.dropout, self.use_bias, self.use_gate = float(dropout), bool(use_bias), bool(use_gate)
        self.output_dim, self.sliding_window, self.seed = output_shape, sliding_window, seed
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = (
            None if bias_initializer is None else keras.initializers.get(bias_initializer)
        )
        self._given_num_particles = num_particles
        self.num_particles = num_particles
        self.deterministic = bool(deterministic)
        self.kernel_prior, self.bias_prior = (
            priors_lib.get(kernel_prior),
            priors_lib.get(bias_prior),
        )
        self.lora_rank, self.lora_alpha = lora_rank, lora_alpha
        self.lora_projections = tuple(lora_projections)
        self.supports_masking = True
        self._softmax = keras.layers.Softmax(axis=-1, dtype=self.dtype_policy)
        # (batch, N, heads, T, S)
        self._dropout_layer = Dropout(self.dropout, seed=seed, dtype=self.dtype_policy)

    @property
    def broadcasts(self):
        """True when this layer starts the particle axis (its inputs have none)."""
        return self._given_num_particles is not None

    def _carries(self, shape, what):
        """Whether an input of `shape` carries the particle axis (rank 4) or not (rank 3)."""
        rank = len(shape)
        if rank == 3 or (rank == 4 and not self.broadcasts):
            return rank == 4
        expected = (
            "(batch, time, features)"
            if self.broadcasts
            else "(batch, particles, time, features) or (batch, time, features)"
        )
        raise ValueError(
            f"MultiHeadAttention '{self.name}': {what} must be {expected}; got shape {tuple(shape)}."
        )

    def _projection(self, name, equation, output_shape, bias_axes, carries, activation=None):
        initializer = self.kernel_initializer.__class__.from_config(
            self.kernel_initializer.get_config()
        )
        common = dict(
            activation=activation,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=initializer,
            name=name,
            dtype=self.dtype_policy,
        )
        if self.lora_rank is None:
            return EinsumDense(
                equation,
                output_shape,
                bias_initializer=self.bias_initializer,
                num_particles=None if carries else self.num_particles,
                deterministic=self.deterministic,
                kernel_prior=self.kernel_prior,
                bias_prior=self.bias_prior,
                **common,
            )
        if name in self.lora_projections:
            return LoRAEinsumDense(
                equation,
                output_shape,
                rank=self.lora_rank,
                lora_alpha=self.lora_alpha,
                num_particles=None if carries else self.num_particles,
                deterministic=self.deterministic,
                kernel_prior=self.kernel_prior,
                bias_initializer=self.bias_initializer or "zeros",
                **common,
            )
        # frozen and shared: on an input without the particle axis, Keras' layer (computed once)
        if not carries:
            return keras.layers.EinsumDense(
                equation,
                output_shape,
                bias_initializer=self.bias_initializer or "zeros",
                trainable=False,
                **common,
            )
        return EinsumDense(
            equation,
            output_shape,
            bias_initializer=self.bias_initializer or "zeros",
            deterministic=True,
            kernel_prior=self.kernel_prior,
            bias_prior=self.bias_prior,
            trainable=False,
            **common,
        )

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        carries = [
            self._carries(s, what)
            for s, what in ((query_shape, "query"), (value_shape, "value"), (key_shape, "key"))
        ]
        if not self.broadcasts:
            if not any(carries):
                raise ValueError(
                    f"MultiHeadAttention '{self.name}' received no particle axis (inputs of rank 3): if "
                    "it is the first Bayesian layer, pass num_particles=N to it."
                )
            counts = {s[1] for s, c in zip((query_shape, value_shape, key_shape), carries) if c}
            if len(counts) != 1 or None in counts:
                raise ValueError(
                    f"MultiHeadAttention '{self.name}': the inputs' particle axes disagree or are "
                    f"unknown: {sorted(map(str, counts))}."
                )
            self.num_particles = int(counts.pop())
        if None not in (value_shape[-2], key_shape[-2]) and value_shape[-2] != key_shape[-2]:
            raise ValueError(
                f"MultiHeadAttention '{self.name}': value and key need the same time axis; got "
                f"{tuple(value_shape)} and {tuple(key_shape)}."
            )
        heads = (None, self.num_heads)
        # built in Keras' order (query, key, gate, value, output), so the weights list as Keras' do
        self._query_dense = self._projection(
            "query", _PROJECTION, heads + (self.key_dim,), "de", carries[0]
        )
        self._query_dense.build(query_shape)
        self._key_dense = self._projection(
            "key", _PROJECTION, heads + (self.key_dim,), "de", carries[2]
        )
        self._key_dense.build(key_shape)
        self._gate_dense = None
        if self.use_gate:
            self._gate_dense = self._projection(
                "gate",
                _PROJECTION,
                heads + (self.value_dim,),
                "de",
                carries[0],
                activation="sigmoid",
            )
            self._gate_dense.build(query_shape)
        self._value_dense = self._projection(
            "value", _PROJECTION, heads + (self.value_dim,), "de", carries[1]
        )
        self._value_dense.build(value_shape)
        output_dim = self.output_dim or query_shape[-1]
        self._output_dense = self._projection(
            "attention_output", _OUTPUT, (None, output_dim), "e", True
        )
        batch, time = query_shape[0], query_shape[-2]
        self._output_dense.build((batch, self.num_particles, time, self.num_heads, self.value_dim))

    @property
    def projections(self):
        """The particle sublayers in the order of the weights (Keras' order): query, key, [gate,] value, output."""
        return [
            d
            for d in (
                self._query_dense,
                self._key_dense,
                self._gate_dense,
                self._value_dense,
                self._output_dense,
            )
            if d is not None
        ]

    @property
    def query_dense(self):
        return self._query_dense

    @property
    def key_dense(self):
        return self._key_dense

    @property
    def value_dense(self):
        return self._value_dense

    @property
    def gate_dense(self):
        return self._gate_dense

    @property
    def output_dense(self):
        return self._output_dense

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
    ):
        # KerasHub's CachedMultiHeadAttention arguments
        if cache is not None or cache_update_index is not None:
            raise ValueError(
                f"MultiHeadAttention '{self.name}': cached decoding (cache=, cache_update_index=) is not "
                "supported; call it with cache=None, as in training and scoring."
            )
        key = value if key is None else key
        query_mask = get_keras_mask(query) if get_keras_mask(query) is not None else query_mask
        for tensor in (query, value, key):  # the masks act here, not in the projections
            set_keras_mask(tensor, None)
        mask = self._attention_mask(
            query, value, query_mask, value_mask, key_mask, attention_mask, use_causal_mask
        )
        q = self._query_dense(query)  # (batch, N, T, heads, key_dim)
        k = self._key_dense(key)
        v = self._value_dense(value)
        q = q * tf.cast(1.0 / math.sqrt(float(self.key_dim)), q.dtype)
        scores = tf.einsum("bnthd,bnshd->bnhts" if len(k.shape) == 5 else "bnthd,bshd->bnhts", q, k)
        # Keras zeroes fully masked rows only here
        explicit = self.dropout > 0.0 or return_attention_scores
        if mask is not None:
            # (batch, T, S) -> (batch, 1, 1, T, S): every particle and head; (batch, N, T, S) of a folded
            # custom layer (each particle's own) -> (batch, N, 1, T, S)
            mask = mask[:, None, None] if len(mask.shape) == 3 else mask[:, :, None]
            scores = tf.where(mask, scores, tf.cast(_large_negative(scores.dtype), scores.dtype))
        probabilities = tf.nn.softmax(scores, axis=-1)
        if mask is not None and explicit:
            probabilities = tf.where(mask, probabilities, tf.zeros_like(probabilities))
        dropped = (
            self._dropout_layer(probabilities, training=training)
            if self.dropout > 0.0
            else probabilities
        )
        out = tf.einsum(
            "bnhts,bnshd->bnthd" if len(v.shape) == 5 else "bnhts,bshd->bnthd", dropped, v
        )
        if self._gate_dense is not None:
            out = out * self._gate_dense(query)
        out = self._output_dense(out)
        if return_attention_scores:
            return out, probabilities
        return out

    def _attention_mask(
        self, query, value, query_mask, value_mask, key_mask, attention_mask, use_causal_mask
    ):
        """Keras' attention mask (batch or 1, T, S) from the padding masks, `attention_mask`, the causal and the
        sliding-window masks, or None; (batch, N, T, S) when a mask given has a particle axis ((batch, N, T) padding
        masks, a (batch, N, T, S) attention mask: the twin inside a folded custom layer)."""
        t, s = tf.shape(query)[-2], tf.shape(value)[-2]
        masks = []
        for given, axis in ((query_mask, -1), (value_mask, -2), (key_mask, -2)):
            if given is not None:
                masks.append(tf.expand_dims(tf.cast(given, tf.bool), axis))
        rows, columns = tf.range(t)[:, None], tf.range(s)[None, :]
        if use_causal_mask:
            masks.append((rows >= columns)[None])
        if self.sliding_window is not None:
            masks.append((tf.abs(rows - columns) < self.sliding_window)[None])
        if attention_mask is not None:
            masks.append(tf.cast(attention_mask, tf.bool))
        if not masks:
            return None
        if any(len(m.shape) == 4 for m in masks):
            masks = [m if len(m.shape) == 4 else m[:, None] for m in masks]
        combined = masks[0]
        for m in masks[1:]:
            combined = tf.logical_and(combined, m)
        return combined

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        shape = tuple(query_shape)
        if len(shape) == 3:
            n = (
                self._given_num_particles
                if self.broadcasts
                else next(s[1] for s in (value_shape, key_shape) if s is not None and len(s) == 4)
            )
            shape = shape[:1] + (n,) + shape[1:]
        return shape[:-1] + (self.output_dim or shape[-1],)

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
    ):
        shape = self.compute_output_shape(
            query.shape, value.shape, None if key is None else key.shape
        )
        out = keras.KerasTensor(shape, dtype=self.compute_dtype)
        if return_attention_scores:
            return out, keras.KerasTensor(
                (shape[0], shape[1], self.num_heads, query.shape[-2], value.shape[-2]),
                dtype=self.compute_dtype,
            )
        return out

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_shape": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": None
                if self.bias_initializer is None
                else keras.initializers.serialize(self.bias_initializer),
                "use_gate": self.use_gate,
                "sliding_window": self.sliding_window,
                "seed": self.seed,
                "num_particles": self._given_num_particles,
                "deterministic": self.deterministic,
                "kernel_prior": priors_lib.serialize(self.kernel_prior),
                "bias_prior": priors_lib.serialize(self.bias_prior),
                "lora_rank": self.lora_rank,
                "lora_alpha": self.lora_alpha,
                "lora_projections": self.lora_projections,
            }
        )
        return config
