"""Particle EinsumDense and MultiHeadAttention against per-particle loops of the Keras layers: each particle of
the particle layer computes what a keras.layers.EinsumDense / MultiHeadAttention with that particle's weights
computes, masks and attention dropout included."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend import set_keras_mask

import bayes_keras as bk

N = 3


def _keras_einsum(equation, output_shape, bias_axes, shape):
    layers = [
        keras.layers.EinsumDense(
            equation,
            output_shape,
            bias_axes=bias_axes,
            activation="tanh",
            bias_initializer="random_normal",
        )
        for _ in range(N)
    ]
    for layer in layers:
        layer.build(shape)
    return layers


def _copy(particle_layer, keras_layers):
    particle_layer.kernel.assign(np.stack([k.kernel.numpy() for k in keras_layers]))
    if particle_layer.bias is not None:
        particle_layer.bias.assign(np.stack([k.bias.numpy() for k in keras_layers]))


@pytest.mark.parametrize(
    "equation, output_shape, bias_axes, shape",
    [
        ("abc,cde->abde", (None, 4, 5), "de", (2, 6, 7)),  # attention's projections
        ("abcd,cde->abe", (None, 7), "e", (2, 6, 4, 5)),  # attention's output
        ("ab,bc->ac", (5,), "c", (2, 7)),
        ("...b,bc->...c", (5,), "c", (2, 6, 7)),  # left ellipsis: the batch axis is its first
        ("...b,bc->...c", (5,), None, (2, 7)),
        ("abc...,cd->abd...", (6, 5), "d", (2, 6, 7, 3)),  # right ellipsis
        ("abc,cd->abd", (6, 5), "bd", (2, 6, 7)),  # a bias over time and units
    ],
)
def test_einsum_dense_is_a_loop_of_keras_layers(equation, output_shape, bias_axes, shape):
    rng = np.random.default_rng(0)
    keras_layers = _keras_einsum(equation, output_shape, bias_axes, shape)
    x = rng.standard_normal(shape).astype("float32")
    first = bk.layers.EinsumDense(
        equation, output_shape, bias_axes=bias_axes, activation="tanh", num_particles=N
    )
    first.build(shape)
    assert tuple(first.kernel.shape) == (N,) + tuple(keras_layers[0].kernel.shape)
    _copy(first, keras_layers)
    expected = np.stack([k(x).numpy() for k in keras_layers], 1)
    np.testing.assert_allclose(first(x).numpy(), expected, atol=1e-6)
    assert first.compute_output_shape(shape) == expected.shape
    xp = rng.standard_normal((shape[0], N) + shape[1:]).astype("float32")
    later = bk.layers.EinsumDense(equation, output_shape, bias_axes=bias_axes, activation="tanh")
    later.build(xp.shape)
    _copy(later, keras_layers)
    np.testing.assert_allclose(
        later(xp).numpy(),
        np.stack([k(xp[:, i]).numpy() for i, k in enumerate(keras_layers)], 1),
        atol=1e-6,
    )
    shared = bk.layers.EinsumDense(
        equation, output_shape, bias_axes=bias_axes, activation="tanh", deterministic=True
    )
    shared.build(xp.shape)
    shared.kernel.assign(keras_layers[0].kernel.numpy())
    if shared.bias is not None:
        shared.bias.assign(keras_layers[0].bias.numpy())
    np.testing.assert_allclose(
        shared(xp).numpy(),
        np.stack([keras_layers[0](xp[:, i]).numpy() for i in range(N)], 1),
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"equation": "ab->b", "output_shape": 3}, "must have the form"),
        ({"equation": "ab,bc->ca", "output_shape": 3}, "must start with the batch axis"),
        ({"equation": "ab,bc->ac", "output_shape": 3, "bias_axes": "z"}, "bias_axes 'z'"),
    ],
)
def test_einsum_dense_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        layer = bk.layers.EinsumDense(num_particles=2, **kwargs)
        layer.build((2, 4))


def _copy_attention(layer, keras_layers):
    for name in ("query_dense", "key_dense", "value_dense", "output_dense", "gate_dense"):
        ours = getattr(layer, name)
        if ours is not None:
            _copy(
                ours,
                [getattr(k, "_gate_dense" if name == "gate_dense" else name) for k in keras_layers],
            )


def _attention_pair(kwargs, query, value, **call):
    keras_layers = [
        keras.layers.MultiHeadAttention(2, 4, bias_initializer="random_normal", **kwargs)
        for _ in range(N)
    ]
    for i, k in enumerate(keras_layers):
        k(
            query[:, i] if query.ndim == 4 else query,
            value[:, i] if value.ndim == 4 else value,
            **call,
        )
    ours = bk.layers.MultiHeadAttention(
        2, 4, num_particles=None if query.ndim == 4 or value.ndim == 4 else N, **kwargs
    )
    ours(query, value, **call)
    _copy_attention(ours, keras_layers)
    return ours, keras_layers


@pytest.mark.parametrize(
    "kwargs, call",
    [
        ({}, {}),
        ({"use_gate": True, "value_dim": 3, "output_shape": 7}, {}),
        ({}, {"use_causal_mask": True}),
        ({"sliding_window": 2}, {"use_causal_mask": True}),
        ({"dropout": 0.3}, {"training": False}),
        ({}, {"return_attention_scores": True}),
    ],
)
def test_attention_is_a_loop_of_keras_layers(kwargs, call):
    rng = np.random.default_rng(1)
    query = rng.standard_normal((2, N, 5, 6)).astype("float32")
    value = (
        query
        if call.get("use_causal_mask")
        else rng.standard_normal((2, N, 4, 6)).astype("float32")
    )
    mask = rng.uniform(size=(2, 5, value.shape[2])) > 0.3
    ours, keras_layers = _attention_pair(kwargs, query, value, attention_mask=mask, **call)
    got = ours(query, value, attention_mask=mask, **call)
    expected = [
        k(query[:, i], value[:, i], attention_mask=mask, **call) for i, k in enumerate(keras_layers)
    ]
    if call.get("return_attention_scores"):
        np.testing.assert_allclose(
            got[1].numpy(), np.stack([e[1].numpy() for e in expected], 1), atol=1e-6
        )
        got, expected = got[0], [e[0] for e in expected]
    np.testing.assert_allclose(got.numpy(), np.stack([e.numpy() for e in expected], 1), atol=1e-5)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_attention_padding_masks_as_keras(dropout):
    """Keras masks of the query and value (padding), fully masked query rows included (Keras' fused path gives
    them uniform attention, its explicit path with dropout zeros): the same per particle."""
    rng = np.random.default_rng(2)
    query = rng.standard_normal((2, N, 5, 6)).astype("float32")
    value = rng.standard_normal((2, N, 4, 6)).astype("float32")
    query_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    value_mask = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], bool)

    def masked(x):
        x = tf.constant(x)
        set_keras_mask(x, tf.constant(query_mask if x.shape[-2] == 5 else value_mask))
        return x

    ours, keras_layers = _attention_pair({"dropout": dropout}, query, value)
    got = ours(masked(query), masked(value), value_mask=value_mask).numpy()
    expected = np.stack(
        [
            k(masked(query[:, i]), masked(value[:, i]), value_mask=value_mask).numpy()
            for i, k in enumerate(keras_layers)
        ],
        1,
    )
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_attention_starts_the_particle_axis_and_attends_across():
    """num_particles on (batch, T, F) inputs; cross-attention to an encoder output without a particle axis."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 6)).astype("float32")
    ours, keras_layers = _attention_pair({}, x, x)
    np.testing.assert_allclose(
        ours(x, x).numpy(), np.stack([k(x, x).numpy() for k in keras_layers], 1), atol=1e-5
    )
    query = rng.standard_normal((2, N, 5, 6)).astype("float32")
    encoded = rng.standard_normal((2, 4, 6)).astype("float32")
    ours, keras_layers = _attention_pair({}, query, encoded)
    assert ours.value_dense.broadcasts and not ours.query_dense.broadcasts
    np.testing.assert_allclose(
        ours(query, encoded).numpy(),
        np.stack([k(query[:, i], encoded).numpy() for i, k in enumerate(keras_layers)], 1),
        atol=1e-5,
    )


def test_perturbing_one_particle_changes_only_its_output():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, N, 5, 6)).astype("float32")
    layer = bk.layers.MultiHeadAttention(2, 4)
    before = layer(x, x).numpy()
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense):
        kernel = dense.kernel.numpy()
        kernel[1] += 0.5 * rng.standard_normal(kernel[1].shape)
        dense.kernel.assign(kernel)
    after = layer(x, x).numpy()
    np.testing.assert_array_equal(after[:, [0, 2]], before[:, [0, 2]])
    assert np.abs(after[:, 1] - before[:, 1]).min() > 0


def test_attention_dropout_draws_per_particle_and_example():
    """With shared weights and identical inputs, training-mode outputs differ across particles and examples
    (independent dropout), the dropped fraction is the rate, and inference is deterministic."""
    x = np.ones((4, N, 6, 5), "float32") + np.arange(6, dtype="float32")[None, None, :, None]
    layer = bk.layers.MultiHeadAttention(2, 4, dropout=0.5, deterministic=True, seed=0)
    out = layer(x, x, training=True).numpy()
    assert np.abs(out[:, 0] - out[:, 1]).max() > 1e-3 and np.abs(out[0] - out[1]).max() > 1e-3
    np.testing.assert_array_equal(layer(x, x).numpy(), layer(x, x).numpy())
    probabilities = tf.ones((64, N, 2, 6, 6)) / 6.0
    dropped = layer._dropout_layer(probabilities, training=True).numpy()
    assert abs(np.mean(dropped == 0) - 0.5) < 0.02


def test_a_transformer_of_particle_layers_trains_and_round_trips(tmp_path):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((8,), dtype="int32")
    h = bk.layers.Embedding(20, 8, mask_zero=True, num_particles=N)(tokens)
    h = bk.layers.LayerNormalization()(h + bk.layers.MultiHeadAttention(2, 4, dropout=0.1)(h, h))
    h = bk.layers.GlobalAveragePooling1D()(h)
    model = bk.BayesianModel(tokens, bk.layers.Dense(2)(h), likelihood="categorical")
    rng = np.random.default_rng(5)
    x = rng.integers(1, 20, (64, 8))
    x[:, 6:] = 0  # padding
    y = (x[:, 0] > 10).astype("int64")
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(model(x, training=True)))
    assert all(float(tf.reduce_max(tf.abs(g))) > 0 for g in tape.gradient(loss, variables))
    history = model.fit(x, y, epochs=30, batch_size=64, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded.predict_particles(x), model.predict_particles(x), atol=1e-6)


def _keras_transformer(dropout=0.0, causal=False):
    """A small functional text transformer of Keras layers: masked embedding, self-attention, LayerNormalization,
    a feed-forward EinsumDense, masked pooling, softmax head."""
    keras.utils.set_random_seed(0)
    tokens = keras.Input((8,), dtype="int32")
    h = keras.layers.Embedding(20, 8, mask_zero=True, name="embedding")(tokens)
    attended = keras.layers.MultiHeadAttention(
        2, 4, dropout=dropout, name="attention", bias_initializer="random_normal"
    )(h, h, use_causal_mask=causal)
    h = keras.layers.LayerNormalization(name="norm", beta_initializer="random_normal")(h + attended)
    h = keras.layers.EinsumDense(
        "abc,cd->abd", (None, 8), bias_axes="d", activation="relu", name="ffn"
    )(h)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(tokens, keras.layers.Dense(3, activation="softmax", name="head")(h))


def _tokens(n=16):
    x = np.random.default_rng(6).integers(1, 20, (n, 8))
    x[: n // 2, 5:] = 0  # padded examples: masked keys, fully masked query rows
    return x


@pytest.mark.parametrize("dropout, causal", [(0.0, False), (0.1, True)])
def test_converted_transformer_is_exact(dropout, causal, tmp_path):
    keras_model = _keras_transformer(dropout, causal)
    x = _tokens()
    model = bk.bayesianize(keras_model, num_particles=N, noise_std=0.0)
    expected = np.broadcast_to(keras_model.predict(x, verbose=0)[:, None], (len(x), N, 3))
    np.testing.assert_allclose(tf.nn.softmax(model(x)).numpy(), expected, atol=1e-5)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(tf.nn.softmax(loaded(x)).numpy(), expected, atol=1e-5)
    report = bk.conversion_report(model)
    assert {r.name: r.role for r in report.rows} == {
        "embedding": "bayesian",
        "attention/query": "bayesian",
        "attention/key": "bayesian",
        "attention/value": "bayesian",
        "attention/attention_output": "bayesian",
        "norm": "bayesian",
        "ffn": "bayesian",
        "head": "bayesian",
    }
    assert report.bayesian_fraction == 1.0
    assert all(len(v.shape) >= 2 and v.shape[0] == N for v in model.trainable_variables)


def test_converted_attention_particles_start_at_the_keras_weights():
    """With noise, every particle of the attention projections is the Keras weight plus its own jitter."""
    keras_model = _keras_transformer()
    model = bk.bayesianize(keras_model, num_particles=N, noise_std=0.1, seed=0)
    original = keras_model.get_layer("attention")
    converted = model.get_layer("attention")
    for keras_weight, ours in zip(
        original.weights, [v for d in converted.projections for v in d.weights]
    ):
        values = ours.numpy()
        assert values.shape == (N,) + tuple(keras_weight.shape)
        spread = values - keras_weight.numpy()[None]
        assert 0 < np.std(spread) < 0.2 * max(np.sqrt(np.mean(keras_weight.numpy() ** 2)), 0.01) * 2
        assert not np.allclose(values[0], values[1])


def test_frozen_attention_before_a_bayesian_head_runs_once():
    keras_model = _keras_transformer()
    model = bk.bayesianize(keras_model, num_particles=N, noise_std=0.0, bayesian=["head"])
    assert isinstance(model.get_layer("attention"), keras.layers.MultiHeadAttention)
    assert not isinstance(model.get_layer("attention"), bk.layers.MultiHeadAttention)
    x = _tokens()
    np.testing.assert_allclose(
        tf.nn.softmax(model(x)).numpy(),
        np.broadcast_to(keras_model.predict(x, verbose=0)[:, None], (len(x), N, 3)),
        atol=1e-5,
    )


@keras.saving.register_keras_serializable(package="test_attention")
class TransformerBlock(keras.layers.Layer):
    """The keras.io text-classification transformer block, as written there."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [keras.layers.Dense(ff_dim, activation="relu"), keras.layers.Dense(embed_dim)]
        )
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.dropout1(self.att(inputs, inputs))
        out1 = self.layernorm1(inputs + attn_output)
        return self.layernorm2(out1 + self.dropout2(self.ffn(out1)))


@keras.saving.register_keras_serializable(package="test_attention")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """The keras.io token and position embedding: the position table is looked up on ops.arange(maxlen)."""

    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        positions = self.pos_emb(keras.ops.arange(start=0, stop=keras.ops.shape(x)[-1], step=1))
        return self.token_emb(x) + positions


def _keras_io_transformer():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    x = TokenAndPositionEmbedding(8, 20, 8, name="embedding")(inputs)
    x = TransformerBlock(8, 2, 16, name="block")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.Dense(12, activation="relu", name="hidden")(x)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="head")(x))


def test_custom_layers_named_or_not_in_bayesian(tmp_path):
    """bayesian= picks custom layers too. A custom layer after the particle axis that is not picked runs per particle
    with shared weights (was refused as "not a Keras layer": the per-example check ran the Keras layer on particle
    shapes); under LoRA a picked custom layer without attention gets its Embeddings adapted (was left frozen)."""
    keras_model = _keras_io_transformer()
    x = np.random.default_rng(7).integers(0, 20, (16, 8)).astype("float32")
    expected = np.broadcast_to(keras_model.predict(x, verbose=0)[:, None], (16, N, 2))
    model = bk.bayesianize(keras_model, num_particles=N, noise_std=0.0, bayesian=["embedding"])
    np.testing.assert_allclose(tf.nn.softmax(model(x)).numpy(), expected, atol=1e-5)
    roles = {r.name: r.role for r in bk.conversion_report(model).rows}
    assert (
        roles["embedding/token_emb"] == roles["embedding/pos_emb"] == "bayesian"
        and roles["block"] == "shared"
    ), roles
    lora = bk.bayesianize(
        keras_model, num_particles=N, noise_std=0.0, lora_rank=2, bayesian=["embedding", "head"]
    )
    np.testing.assert_allclose(tf.nn.softmax(lora(x)).numpy(), expected, atol=1e-5)
    assert [v.path.rsplit("/", 1)[-1] for v in lora.trainable_variables] == 2 * [
        "lora_embeddings_a",
        "lora_embeddings_b",
    ] + ["kernel", "bias"]


def test_frozen_custom_layers_stay_frozen_after_a_round_trip(tmp_path):
    """Under LoRA the keras.io token + position embedding (a custom layer) is frozen before the particle axis; its
    config rebuilds its Embeddings trainable, so the model restores the flags on load: the same trainable variables,
    and the optimizer's state loads."""
    keras_model = _keras_io_transformer()
    x = np.random.default_rng(7).integers(0, 20, (16, 8)).astype("float32")
    model = bk.bayesianize(keras_model, num_particles=N, lora_rank=2, seed=0)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, np.arange(16) % 2, epochs=1, batch_size=8, verbose=0)
    model.save(tmp_path / "m.keras")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*Skipping variable loading")
        loaded = keras.models.load_model(tmp_path / "m.keras")
    assert [v.path.rsplit("/", 3)[-3:] for v in loaded.trainable_variables] == [
        v.path.rsplit("/", 3)[-3:] for v in model.trainable_variables
    ]
    assert not any("embedding" in v.path for v in loaded.trainable_variables)
    assert int(loaded.optimizer.iterations) == 2
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_keras_io_transformer_with_custom_layers_converts_exactly(tmp_path):
    """Custom layers' weight sublayers (two embeddings, one looked up without a batch axis; attention; a Sequential
    feed-forward; LayerNormalization) become particle twins: exact at noise 0, in memory and after .keras, and
    every weight carries the particle axis."""
    keras_model = _keras_io_transformer()
    x = np.random.default_rng(7).integers(0, 20, (16, 8)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left shared, so nothing is warned
        model = bk.bayesianize(keras_model, num_particles=N, noise_std=0.0)
    expected = np.broadcast_to(keras_model.predict(x, verbose=0)[:, None], (16, N, 2))
    np.testing.assert_allclose(tf.nn.softmax(model(x)).numpy(), expected, atol=1e-5)
    report = bk.conversion_report(model)
    assert report.bayesian_fraction == 1.0, str(report)
    assert all(v.shape[0] == N for v in model.trainable_variables)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(tf.nn.softmax(loaded(x)).numpy(), expected, atol=1e-5)
    noisy = bk.bayesianize(keras_model, num_particles=N, noise_std=0.1, seed=0)
    outputs = noisy.predict_particles(x)
    assert np.abs(outputs[:, 0] - outputs[:, 1]).max() > 1e-3


@keras.saving.register_keras_serializable(package="test_attention")
class Doubled(keras.layers.Dense):
    """A Dense subclass whose call differs from Dense's (so a particle Dense cannot stand in for it)."""

    def call(self, x):
        return 2.0 * super().call(x)


@keras.saving.register_keras_serializable(package="test_attention")
class Holder(keras.layers.Layer):
    """A custom layer over such a sublayer."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = Doubled(4)

    def call(self, x):
        return self.dense(x)


def test_custom_layer_whose_twins_differ_stays_shared_and_is_named():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5, 3))
    h = Holder(name="holder")(keras.layers.Dense(4, name="first")(inputs))
    h = keras.layers.GlobalAveragePooling1D()(h)
    keras_model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="head")(h))
    with pytest.warns(
        UserWarning, match="'holder' .*stay shared.*computes other than its particle twin"
    ) as caught:
        model = bk.bayesianize(keras_model, num_particles=N, noise_std=0.0)
    assert any(
        "holder" in str(w.message) and "shared by all particles" in str(w.message) for w in caught
    )
    x = np.random.default_rng(8).standard_normal((6, 5, 3)).astype("float32")
    np.testing.assert_allclose(
        tf.nn.softmax(model(x)).numpy(),
        np.broadcast_to(keras_model.predict(x, verbose=0)[:, None], (6, N, 2)),
        atol=1e-5,
    )
    roles = {r.name: r.role for r in bk.conversion_report(model).rows}
    assert roles["holder"] == "shared" and roles["first"] == "bayesian"


@keras.saving.register_keras_serializable(package="test_attention")
class CausalBlock(keras.layers.Layer):
    """A decoder block that makes its causal mask from the length of axis 1 and averages over axis 1, as KerasHub's
    TransformerDecoder and pooling layers do: in the particle layout axis 1 is the particle axis."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = keras.layers.MultiHeadAttention(2, 4)
        self.norm = keras.layers.LayerNormalization()

    def call(self, x):
        steps = keras.ops.arange(keras.ops.shape(x)[1])
        causal = keras.ops.expand_dims(steps[:, None] >= steps[None, :], 0)
        h = self.norm(x + self.attention(x, x, attention_mask=causal))
        return keras.ops.mean(h, axis=1)


def _causal_model():
    """Padded tokens: the Embedding's mask reaches the block's attention as its query mask."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), dtype="int32")
    h = CausalBlock(name="block")(
        keras.layers.Embedding(10, 8, mask_zero=True, name="first")(inputs)
    )
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="head")(h))


def test_custom_layer_that_reads_axis_one_converts_folded(tmp_path):
    """Its call runs on the batch of B*N examples and the twins unfold: exact at noise 0 (all particles, and LoRA),
    after .keras too, with nothing left shared, and perturbing one particle's attention changes only its output."""
    keras_model = _causal_model()
    x = np.random.default_rng(9).integers(1, 10, (5, 6)).astype("int32")
    x[:2, 4:] = 0
    expected = np.broadcast_to(keras_model.predict(x, verbose=0)[:, None], (5, N, 2))
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "error", message="bayesianize"
        )  # nothing is left shared, so nothing is warned
        model = bk.bayesianize(keras_model, num_particles=N, noise_std=0.0)
        lora = bk.bayesianize(keras_model, num_particles=N, lora_rank=2, noise_std=0.0)
    assert model.get_layer("block").folded
    assert bk.conversion_report(model).bayesian_fraction == 1.0
    for converted in (model, lora):
        np.testing.assert_allclose(tf.nn.softmax(converted(x)).numpy(), expected, atol=1e-5)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(tf.nn.softmax(loaded(x)).numpy(), expected, atol=1e-5)
    for variable in model.get_layer("block").trainable_variables:
        if "attention" in variable.path:
            variable.assign(
                variable.numpy() + np.eye(N)[1].reshape((N,) + (1,) * (variable.ndim - 1))
            )
    changed = np.abs(tf.nn.softmax(model(x)).numpy() - expected).max(axis=(0, 2))
    assert changed[1] > 1e-3 and changed[0] < 1e-6 and changed[2] < 1e-6, changed


def test_subclasses_of_converted_layers_convert_when_they_compute_the_same():
    """keras.layers.ReversibleEmbedding (KerasHub's token embedding) converts as an Embedding, and so does a
    BatchNormalization subclass that computes as BatchNormalization; a Dense subclass whose call differs stays a
    shared point estimate, with a warning; a BatchNormalization subclass whose call differs is refused (kept, its
    batch statistics would mix the particles)."""

    class Doubled(keras.layers.Dense):
        def call(self, inputs):
            return 2.0 * super().call(inputs)

    class Renamed(keras.layers.BatchNormalization):
        pass

    class Shifted(keras.layers.BatchNormalization):
        def call(self, inputs, training=None, mask=None):
            return super().call(inputs, training=training) + 1.0

    inputs = keras.Input((4,))
    h = Renamed(name="renamed")(keras.layers.Dense(8, name="first")(inputs))
    renamed = bk.bayesianize(
        keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h)), num_particles=N
    )
    assert isinstance(renamed.get_layer("renamed"), bk.layers.BatchNormalization)
    h = Shifted(name="shifted")(keras.layers.Dense(8)(inputs))
    with pytest.raises(ValueError, match="'shifted' .*its call differs from BatchNormalization's"):
        bk.bayesianize(
            keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h)), num_particles=N
        )

    keras.utils.set_random_seed(0)
    tokens = keras.Input((6,), dtype="int32")
    h = keras.layers.ReversibleEmbedding(20, 8, name="tokens")(tokens)
    h = keras.layers.GlobalAveragePooling1D()(h)
    h = Doubled(5, name="doubled")(h)
    keras_model = keras.Model(tokens, keras.layers.Dense(3, activation="softmax", name="head")(h))
    with pytest.warns(
        UserWarning, match="'doubled' .*subclasses Dense.*stays a shared point estimate"
    ):
        model = bk.bayesianize(keras_model, num_particles=N, noise_std=0.0)
    roles = {r.name: r.role for r in bk.conversion_report(model).rows}
    assert roles == {"tokens": "bayesian", "doubled": "shared", "head": "bayesian"}
    x = np.random.default_rng(9).integers(0, 20, (5, 6))
    np.testing.assert_allclose(
        tf.nn.softmax(model(x)).numpy(),
        np.broadcast_to(keras_model.predict(x, verbose=0)[:, None], (5, N, 3)),
        atol=1e-5,
    )
