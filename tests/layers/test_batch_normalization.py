"""Particle BatchNormalization equals a per-particle loop of keras.layers.BatchNormalization."""

import keras
import numpy as np
import pytest

import bayes_keras as bk


def _particle(y, p):
    """Particle p of a (batch, N, ...) activation or of a (batch, H, W, N, C) image."""
    return y[:, :, :, p] if y.ndim == 5 else y[:, p]


def _without_particles(shape):
    return shape[:3] + shape[4:] if len(shape) == 5 else shape[:1] + shape[2:]


@pytest.mark.parametrize("shape", [(16, 3, 5), (6, 3, 5, 4), (8, 4, 4, 3, 6)])
def test_equals_a_loop_of_keras_batch_normalization(shape):
    rng = np.random.default_rng(0)
    n, channels = shape[3 if len(shape) == 5 else 1], shape[-1]
    layer = bk.layers.BatchNormalization(momentum=0.9, epsilon=1e-3)
    layer.build(shape)
    layer.gamma.assign(rng.uniform(0.5, 1.5, (n, channels)))
    layer.beta.assign(rng.standard_normal((n, channels)))
    refs = []
    for p in range(n):
        ref = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-3)
        ref.build(_without_particles(shape))
        ref.gamma.assign(layer.gamma.numpy()[p])
        ref.beta.assign(layer.beta.numpy()[p])
        refs.append(ref)
    for step in range(3):  # training steps move the moving averages
        x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
        y = layer(x, training=True).numpy()
        for p, ref in enumerate(refs):
            np.testing.assert_allclose(
                _particle(y, p), ref(_particle(x, p), training=True).numpy(), rtol=1e-4, atol=1e-5
            )
    for p, ref in enumerate(refs):
        np.testing.assert_allclose(
            layer.moving_mean.numpy()[p], ref.moving_mean.numpy(), rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            layer.moving_variance.numpy()[p], ref.moving_variance.numpy(), rtol=1e-5
        )
    x = rng.standard_normal(shape).astype(np.float32)
    y = layer(x, training=False).numpy()
    for p, ref in enumerate(refs):
        np.testing.assert_allclose(
            _particle(y, p), ref(_particle(x, p), training=False).numpy(), rtol=1e-4, atol=1e-5
        )


@pytest.mark.parametrize("training", [True, False])
def test_particles_stay_independent(training):
    inputs = keras.Input((4, 4, 2))
    h = bk.layers.Conv2D(3, 3, padding="same", num_particles=3)(inputs)
    h = bk.layers.BatchNormalization()(h)
    out = bk.layers.Dense(2)(bk.layers.Flatten()(h))
    model = bk.BayesianModel(inputs, out, likelihood="categorical")
    x = np.random.default_rng(1).standard_normal((6, 4, 4, 2)).astype(np.float32)
    before = model(x, training=training).numpy()
    bn = model.layers[2]
    bn.gamma.assign(
        bn.gamma.numpy() + np.array([[0.0], [5.0], [0.0]], np.float32)
    )  # perturb particle 1
    conv = model.layers[1]
    conv.kernel.assign(
        conv.kernel.numpy() * np.array([1.0, 3.0, 1.0], np.float32)[:, None, None, None, None]
    )
    after = model(x, training=training).numpy()
    np.testing.assert_allclose(after[:, [0, 2]], before[:, [0, 2]], rtol=1e-6, atol=1e-6)
    assert np.abs(after[:, 1] - before[:, 1]).max() > 1e-3


def test_trains_with_every_sampling_optimizer_and_round_trips(tmp_path):
    (x, y), _ = bk.datasets.load_digits()
    for optimizer in (
        bk.optimizers.GaussianParticleFlow(),
        bk.optimizers.SVGD(),
        bk.optimizers.IndependentParticles(),
        bk.optimizers.MeanFieldVI(),
    ):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8, 8, 1))
        h = bk.layers.Conv2D(6, 3, padding="same", num_particles=3)(inputs)
        h = bk.layers.Activation("relu")(bk.layers.BatchNormalization()(h))
        out = bk.layers.Dense(10)(bk.layers.GlobalAveragePooling2D()(h))
        model = bk.BayesianModel(inputs, out, likelihood="categorical")
        model.compile(optimizer=optimizer)
        losses = model.fit(x[:256], y[:256], epochs=3, batch_size=64, verbose=0).history["loss"]
        assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], (
            type(optimizer).__name__,
            losses,
        )
    path = tmp_path / "bn.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        loaded.predict_particles(x[:8]), model.predict_particles(x[:8]), rtol=1e-6
    )


@pytest.mark.parametrize("shape", [(6, 3, 5), (4, 2, 2, 3, 6)])
def test_layer_normalization_equals_a_loop_of_keras(shape):
    rng = np.random.default_rng(3)
    n, channels = shape[3 if len(shape) == 5 else 1], shape[-1]
    layer = bk.layers.LayerNormalization(epsilon=1e-3)
    layer.build(shape)
    layer.gamma.assign(rng.uniform(0.5, 1.5, (n, channels)))
    layer.beta.assign(rng.standard_normal((n, channels)))
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    y = layer(x).numpy()
    for p in range(n):
        ref = keras.layers.LayerNormalization(epsilon=1e-3)
        ref.build(_without_particles(shape))
        ref.set_weights([layer.gamma.numpy()[p], layer.beta.numpy()[p]])
        np.testing.assert_allclose(
            _particle(y, p), ref(_particle(x, p)).numpy(), rtol=1e-4, atol=1e-5
        )
    with pytest.raises(ValueError, match="last axis"):
        bk.layers.LayerNormalization(axis=1)


def test_shared_scale_on_images_equals_a_loop_of_keras():
    """deterministic=True: one gamma / beta for every particle (tiled over the fused op's N*C channels),
    moving statistics still per particle."""
    rng = np.random.default_rng(5)
    shape = (8, 3, 3, 2, 4)
    layer = bk.layers.BatchNormalization(momentum=0.5, deterministic=True)
    layer.build(shape)
    layer.gamma.assign(rng.uniform(0.5, 1.5, 4))
    layer.beta.assign(rng.standard_normal(4))
    x = (rng.standard_normal(shape) * 2 - 1).astype(np.float32)
    y = layer(x, training=True).numpy()
    for p in range(2):
        ref = keras.layers.BatchNormalization(momentum=0.5)
        ref.build(_without_particles(shape))
        ref.set_weights([layer.gamma.numpy(), layer.beta.numpy(), np.zeros(4), np.ones(4)])
        np.testing.assert_allclose(
            _particle(y, p), ref(_particle(x, p), training=True).numpy(), rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(
            layer.moving_variance.numpy()[p], ref.moving_variance.numpy(), rtol=1e-5
        )
