"""Bayesian LoRA: the LoRA layers against per-particle loops of Keras layers with enable_lora, bayesianize's
lora_rank (frozen weights stored once, N x the adapters trainable, the particle axis inside the attention), and
with one particle and a flat prior, Keras' own enable_lora + Adam, step for step."""

import sys
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk

from paths import TESTS

sys.path.insert(0, os.path.join(TESTS, "layers"))
from test_attention import _keras_io_transformer, _keras_transformer, _tokens  # noqa: E402

N = 3


def _lora_keras(layer_factory, x, rank=2, alpha=3):
    """N Keras layers with the same frozen weights and their own LoRA factors (random B, so updates differ)."""
    base = layer_factory()
    base(x)
    layers = []
    for _ in range(N):
        layer = layer_factory()
        layer(x)
        layer.set_weights(base.get_weights())
        layer.enable_lora(rank, lora_alpha=alpha, b_initializer="random_normal")
        layers.append(layer)
    return base, layers


@pytest.mark.parametrize(
    "equation, output_shape, bias_axes, shape",
    [
        ("abc,cde->abde", (None, 4, 5), "de", (2, 6, 7)),
        ("...b,bc->...c", (5,), "c", (2, 6, 7)),
        (
            "ab,cb->ac",
            (4,),
            "c",
            (2, 5),
        ),  # the kernel's last axis contracted: the update is materialised
    ],
)
def test_lora_einsum_dense_is_a_loop_of_keras_lora_layers(equation, output_shape, bias_axes, shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32")
    base, keras_layers = _lora_keras(
        lambda: keras.layers.EinsumDense(
            equation, output_shape, bias_axes=bias_axes, bias_initializer="random_normal"
        ),
        x,
    )
    for first in (True, False):
        layer = bk.layers.LoRAEinsumDense(
            equation,
            output_shape,
            rank=2,
            lora_alpha=3,
            bias_axes=bias_axes,
            num_particles=N if first else None,
        )
        inputs = x if first else np.stack([x + n for n in range(N)], 1)
        layer.build(inputs.shape)
        layer.kernel.assign(base.kernel.numpy())
        if bias_axes:
            layer.bias.assign(base.bias.numpy())
        layer.lora_kernel_a.assign(np.stack([k.lora_kernel_a.numpy() for k in keras_layers]))
        layer.lora_kernel_b.assign(np.stack([k.lora_kernel_b.numpy() for k in keras_layers]))
        expected = np.stack(
            [k(x if first else x + n).numpy() for n, k in enumerate(keras_layers)], 1
        )
        np.testing.assert_allclose(layer(inputs).numpy(), expected, atol=2e-6)
        assert tuple(layer.kernel.shape) == tuple(base.kernel.shape) and not layer.kernel.trainable
        assert [v.path.rsplit("/", 1)[-1] for v in layer.trainable_variables] == [
            "lora_kernel_a",
            "lora_kernel_b",
        ]


def test_lora_embedding_is_a_loop_of_keras_lora_layers():
    ids = np.random.default_rng(1).integers(0, 10, (4, 6))
    base, keras_layers = _lora_keras(lambda: keras.layers.Embedding(10, 5), ids)
    layer = bk.layers.LoRAEmbedding(10, 5, rank=2, lora_alpha=3, num_particles=N)
    layer.build(ids.shape)
    layer.embeddings.assign(base.embeddings.numpy())
    layer.lora_embeddings_a.assign(np.stack([k.lora_embeddings_a.numpy() for k in keras_layers]))
    layer.lora_embeddings_b.assign(np.stack([k.lora_embeddings_b.numpy() for k in keras_layers]))
    np.testing.assert_allclose(
        layer(ids).numpy(), np.stack([k(ids).numpy() for k in keras_layers], 1), atol=2e-6
    )


@pytest.mark.parametrize("first", [True, False])
def test_lora_attention_adapts_query_and_value_and_keeps_keys_shared(first):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 6)).astype("float32")
    base = keras.layers.MultiHeadAttention(2, 4, bias_initializer="random_normal")
    base(x, x)
    keras_layers = []
    for _ in range(N):
        layer = keras.layers.MultiHeadAttention(2, 4)
        layer(x, x)
        layer.set_weights(base.get_weights())
        layer.query_dense.enable_lora(2, b_initializer="random_normal")
        layer.value_dense.enable_lora(2, b_initializer="random_normal")
        keras_layers.append(layer)
    ours = bk.layers.MultiHeadAttention(2, 4, lora_rank=2, num_particles=N if first else None)
    inputs = x if first else np.stack([x + n for n in range(N)], 1)
    ours(inputs, inputs)
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
        mine, theirs = getattr(ours, name), getattr(base, name)
        mine.kernel.assign(theirs.kernel.numpy())
        mine.bias.assign(theirs.bias.numpy())
        if name in ("query_dense", "value_dense"):
            mine.lora_kernel_a.assign(
                np.stack([getattr(k, name).lora_kernel_a.numpy() for k in keras_layers])
            )
            mine.lora_kernel_b.assign(
                np.stack([getattr(k, name).lora_kernel_b.numpy() for k in keras_layers])
            )
    expected = np.stack(
        [
            k(x if first else x + n, x if first else x + n).numpy()
            for n, k in enumerate(keras_layers)
        ],
        1,
    )
    np.testing.assert_allclose(ours(inputs, inputs).numpy(), expected, atol=2e-6)
    assert [v.path.split("/", 1)[1] for v in ours.trainable_variables] == [
        "query/lora_kernel_a",
        "query/lora_kernel_b",
        "value/lora_kernel_a",
        "value/lora_kernel_b",
    ]
    if first:  # the keys of an input without particles are computed once, by a Keras layer
        assert isinstance(ours.key_dense, keras.layers.EinsumDense) and not ours.key_dense.trainable


@pytest.mark.parametrize(
    "make", [_keras_transformer, _keras_io_transformer], ids=["functional", "keras_io"]
)
def test_bayesianize_lora_rank(make, tmp_path):
    """Exact at noise 0; the frozen weights stored once; trainable: N x the adapters plus the head's particles;
    the default adapts query and value; save / load; particles differ with the default noise."""
    keras_model = make()
    x = (
        _tokens()
        if make is _keras_transformer
        else np.random.default_rng(7).integers(0, 20, (16, 8)).astype("float32")
    )
    model = bk.bayesianize(keras_model, num_particles=N, lora_rank=2, noise_std=0.0)
    expected = np.broadcast_to(
        keras_model.predict(x, verbose=0)[:, None],
        (len(x), N, 3 if make is _keras_transformer else 2),
    )
    np.testing.assert_allclose(tf.nn.softmax(model(x)).numpy(), expected, atol=1e-5)
    trainable = model.trainable_variables
    names = [v.path.rsplit("/", 2)[-2:] for v in trainable]
    assert [n for n in names if n[1].startswith("lora")] == [
        ["query", "lora_kernel_a"],
        ["query", "lora_kernel_b"],
        ["value", "lora_kernel_a"],
        ["value", "lora_kernel_b"],
    ]
    assert all(v.shape[0] == N for v in trainable)
    attention_dim = 8
    adapters = 2 * (
        attention_dim * 2 * 2 + 2 * (4 if make is _keras_transformer else 8)
    )  # A: (F, heads, r), B
    assert sum(int(np.prod(v.shape)) for v in trainable if "lora" in v.path) == N * adapters
    frozen = [v for v in model.weights if not v.trainable]
    assert frozen and all(not getattr(v, "is_particle_variable", False) for v in frozen)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), atol=1e-6)
    noisy = bk.bayesianize(keras_model, num_particles=N, lora_rank=2)
    outputs = noisy.predict_particles(x)
    assert np.abs(outputs[:, 0] - outputs[:, 1]).max() > 0


def test_one_particle_with_a_flat_prior_is_keras_lora_with_adam():
    """N = 1, IndependentParticles (Adam), a flat prior: each step equals Keras' enable_lora + Adam on the same
    model (biases of the adapted layer frozen on both sides; epsilon tiny on both: the losses differ by the
    dataset-size factor, to which Adam is invariant but for epsilon)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    keras_model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="head")(h))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 6)).astype("float32")
    y = rng.integers(0, 3, 32)
    flat = bk.priors.Normal(scale=1e8)
    model = bk.bayesianize(
        keras_model, num_particles=1, lora_rank=2, noise_std=0.0, kernel_prior=flat, bias_prior=flat
    )
    reference = keras.models.clone_model(keras_model)
    reference.set_weights(keras_model.get_weights())
    hidden = reference.get_layer("hidden")
    hidden.enable_lora(2)
    hidden.bias.trainable = False
    ours = model.get_layer("hidden")
    hidden.lora_kernel_a.assign(ours.lora_kernel_a.numpy()[0])
    ours.lora_kernel_b.assign(np.zeros(ours.lora_kernel_b.shape, "float32"))
    reference.compile(
        optimizer=keras.optimizers.Adam(1e-2, epsilon=1e-12), loss="sparse_categorical_crossentropy"
    )
    model.compile(optimizer=bk.optimizers.IndependentParticles(1e-2, epsilon=1e-12))
    for step in range(5):
        reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        for ours_variable, theirs in (
            (ours.lora_kernel_a, hidden.lora_kernel_a),
            (ours.lora_kernel_b, hidden.lora_kernel_b),
            (model.get_layer("head").kernel, reference.get_layer("head").kernel),
            (model.get_layer("head").bias, reference.get_layer("head").bias),
        ):
            np.testing.assert_allclose(
                ours_variable.numpy()[0], theirs.numpy(), atol=1e-5, err_msg=f"step {step}"
            )


def test_lora_refuses_what_it_cannot_adapt():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    keras_model = keras.Model(
        inputs,
        keras.layers.Dense(3, activation="softmax", name="head")(
            keras.layers.GlobalAveragePooling2D()(h)
        ),
    )
    with pytest.raises(
        ValueError, match="lora_rank adapts Dense, EinsumDense, Embedding and MultiHeadAttention"
    ):
        bk.bayesianize(keras_model, lora_rank=2, bayesian=["conv", "head"])
    with pytest.raises(ValueError, match="lora_rank must be a positive integer"):
        bk.bayesianize(keras_model, lora_rank=0)
    with pytest.raises(ValueError, match="lora_alpha=4.0 scales LoRA factors.*pass lora_rank"):
        bk.bayesianize(keras_model, lora_alpha=4.0)  # was ignored


def test_adapters_save_and_load_alone(tmp_path):
    keras_model = _keras_transformer()
    x = _tokens()
    model = bk.bayesianize(keras_model, num_particles=N, lora_rank=2, seed=0)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, np.arange(len(x)) % 3, epochs=2, batch_size=8, verbose=0)
    path = bk.save_adapters(model, tmp_path / "adapters.npz")
    with np.load(path) as stored:  # the trainable weights alone: factors and the head's particles
        assert (
            len(stored.files) == len(model.trainable_variables) + 2 < len(model.weights)
        )  # + paths, scales
    fresh = bk.bayesianize(keras_model, num_particles=N, lora_rank=2, seed=1)
    assert not np.allclose(fresh.predict_particles(x), model.predict_particles(x))
    bk.load_adapters(fresh, path)
    np.testing.assert_allclose(fresh.predict_particles(x), model.predict_particles(x), atol=1e-6)
    other = bk.bayesianize(keras_model, num_particles=N + 1, lora_rank=2)
    with pytest.raises(ValueError, match="another rank or number of particles"):
        bk.load_adapters(other, path)
    other = bk.bayesianize(
        keras_model, num_particles=N, lora_rank=np.int64(2), lora_alpha=8.0
    )  # loaded silently
    with pytest.raises(ValueError, match="lora_alpha / rank = \\[1.0\\].*scales them by \\[4.0\\]"):
        bk.load_adapters(other, path)
    (tmp_path / "notes.npz").write_text("not an archive")
    with pytest.raises(
        ValueError, match="is not a file written by save_adapters"
    ):  # was numpy's pickle advice
        bk.load_adapters(fresh, tmp_path / "notes.npz")


@pytest.mark.parametrize(
    "optimizer",
    [
        "GaussianParticleFlow",
        "SVGD",
        "MatrixSVGD",
        "MGVBP",
        "IndependentParticles",
        "PreconditionedParticles",
    ],
)
def test_every_optimizer_trains_lora_with_its_defaults_or_refuses(optimizer):
    keras_model = _keras_transformer()
    x = _tokens(32)
    y = np.arange(32) % 3
    model = bk.bayesianize(keras_model, num_particles=N, lora_rank=2, seed=0)
    try:
        model.compile(optimizer=getattr(bk.optimizers, optimizer)())
        before = model.evaluate(x, y, verbose=0, return_dict=True)["nll"]
        model.fit(x, y, epochs=10, batch_size=16, verbose=0)
    except ValueError as error:  # a refusal names what works with its defaults; and that works
        assert "GaussianParticleFlow, SVGD, MGVBP, IndependentParticles" in str(error), str(error)
        model = bk.bayesianize(keras_model, num_particles=N, lora_rank=2, seed=0)
        model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
        before = model.evaluate(x, y, verbose=0, return_dict=True)["nll"]
        model.fit(x, y, epochs=10, batch_size=16, verbose=0)
    after = model.evaluate(x, y, verbose=0, return_dict=True)["nll"]
    assert after < before - 0.05, (before, after)  # it trains (a diverging run's NLL grows)


def test_lora_on_the_zoo_vision_transformer():
    """The particle axis starts inside the first attention; the residual adds after it mix a pre-axis tensor with
    particle activations (repeated per particle), and the model-level guard follows the axis from the attention."""
    keras.utils.set_random_seed(0)
    vit = bk.zoo.keras_vision_transformer(num_classes=5)
    keras_model = keras.Model(vit.input, keras.layers.Activation("softmax")(vit.output))
    model = bk.bayesianize(keras_model, num_particles=N, lora_rank=2, noise_std=0.0)
    (x, _), _ = bk.datasets.load_digits()
    np.testing.assert_allclose(
        tf.nn.softmax(model(x[:8])).numpy(),
        np.broadcast_to(keras_model(x[:8]).numpy()[:, None], (8, N, 5)),
        atol=1e-5,
    )
    assert {
        r.name.split("/")[0] for r in bk.conversion_report(model).rows if r.role == "bayesian"
    } == {"block0_attention", "block1_attention", "head"}
