"""Particle layers against per-particle loops of plain TensorFlow ops."""

import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from targets import keras_round_trip


def test_dense_equals_loop_over_particles():
    x = np.random.default_rng(0).standard_normal((7, 4)).astype(np.float32)
    first = bk.layers.Dense(5, num_particles=3, activation="tanh")
    second = bk.layers.Dense(4, activation="sigmoid")
    third = bk.layers.Dense(2)
    third(second(first(x)))
    rng = np.random.default_rng(1)
    for layer in (
        first,
        second,
        third,
    ):  # nonzero biases, so a bias added to the wrong particle shows
        layer.bias.assign(rng.standard_normal(layer.bias.shape).astype(np.float32))
    h = first(x)
    y = third(second(h)).numpy()
    k1, b1, k2, b2 = (
        first.kernel.numpy(),
        first.bias.numpy(),
        second.kernel.numpy(),
        second.bias.numpy(),
    )
    k3, b3 = third.kernel.numpy(), third.bias.numpy()
    assert h.shape == (7, 3, 5) and y.shape == (7, 3, 2)
    for n in range(3):
        hidden = 1 / (1 + np.exp(-(np.tanh(x @ k1[n] + b1[n]) @ k2[n] + b2[n])))
        np.testing.assert_allclose(y[:, n], hidden @ k3[n] + b3[n], rtol=1e-5, atol=1e-5)
    # particles are initialised independently
    assert not np.allclose(k1[0], k1[1])


def test_dense_on_sequences_keeps_middle_axes():
    x = (
        np.random.default_rng(1).standard_normal((2, 3, 6, 4)).astype(np.float32)
    )  # (batch, N, time, in)
    layer = bk.layers.Dense(5)
    y = layer(x).numpy()
    for n in range(3):
        np.testing.assert_allclose(
            y[:, n], x[:, n] @ layer.kernel.numpy()[n] + layer.bias.numpy()[n], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("padding,strides", [("same", 1), ("valid", 2)])
def test_conv2d_equals_loop_over_particles(padding, strides):
    x = np.random.default_rng(2).standard_normal((2, 9, 9, 3)).astype(np.float32)
    first = bk.layers.Conv2D(
        4, 3, padding=padding, strides=strides, num_particles=3, activation="relu"
    )
    second = bk.layers.Conv2D(2, (2, 3), padding=padding)
    h = first(x)
    y = second(h).numpy()
    k1, b1, k2, b2 = [v.numpy() for v in (first.kernel, first.bias, second.kernel, second.bias)]
    for n in range(3):
        r = tf.nn.relu(tf.nn.conv2d(x, k1[n], strides, padding.upper()) + b1[n])
        r = tf.nn.conv2d(r, k2[n], 1, padding.upper()) + b2[n]
        np.testing.assert_allclose(
            y[:, :, :, n], r.numpy(), rtol=1e-4, atol=1e-5
        )  # (B, H, W, N, F)
    assert tuple(second.compute_output_shape(h.shape)) == y.shape


def test_deterministic_layers_share_weights():
    x = np.random.default_rng(3).standard_normal((4, 6, 6, 1)).astype(np.float32)
    conv = bk.layers.Conv2D(2, 3, num_particles=3, deterministic=True)
    y = conv(x).numpy()
    assert conv.kernel.shape == (3, 3, 1, 2) and y.shape == (4, 4, 4, 3, 2)
    np.testing.assert_allclose(y[:, :, :, 0], y[:, :, :, 2])
    # a shared conv after a particle layer: the same kernel applied to every particle's images
    h = bk.layers.Conv2D(2, 3, padding="same", num_particles=3)(x)
    shared = bk.layers.Conv2D(3, 2, deterministic=True)
    z = shared(h).numpy()
    assert z.shape == (4, 5, 5, 3, 3)
    for n in range(3):
        ref = tf.nn.conv2d(h[:, :, :, n], shared.kernel, 1, "VALID") + shared.bias
        np.testing.assert_allclose(z[:, :, :, n], ref.numpy(), rtol=1e-5, atol=1e-5)
    dense = bk.layers.Dense(3, deterministic=True)
    flat = bk.layers.Flatten()(y).numpy()
    np.testing.assert_allclose(
        flat[:, 1], y[:, :, :, 1].reshape(4, -1)
    )  # Keras' (H, W, C) order per particle
    z = dense(flat).numpy()
    ref = flat @ dense.kernel.numpy() + dense.bias.numpy()
    np.testing.assert_allclose(z, ref, rtol=1e-5, atol=1e-5)
    assert conv.particle_variables == [] and conv.log_prior().shape == ()


def test_pooling_and_flatten_keep_particle_axis():
    x = (
        np.random.default_rng(4).standard_normal((2, 4, 4, 3, 5)).astype(np.float32)
    )  # (B, H, W, N, C)
    mp = bk.layers.MaxPooling2D(2)(x).numpy()
    ap = bk.layers.AveragePooling2D(2)(x).numpy()
    assert mp.shape == (2, 2, 2, 3, 5)
    np.testing.assert_allclose(mp[1, 0, 1, 2], x[1, 0:2, 2:4, 2].max(axis=(0, 1)))
    np.testing.assert_allclose(ap[0, 1, 0, 1], x[0, 2:4, 0:2, 1].mean(axis=(0, 1)), rtol=1e-6)
    flat = bk.layers.Flatten()(x).numpy()
    assert flat.shape == (2, 3, 80)
    np.testing.assert_allclose(flat[:, 2], x[:, :, :, 2].reshape(2, -1))
    # Dense on images acts per pixel (ConvNeXt's pointwise layers), one kernel per particle
    dense = bk.layers.Dense(3)
    y = dense(x).numpy()
    expected = np.einsum("bhwnc,nck->bhwnk", x, dense.kernel.numpy()) + dense.bias.numpy()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_log_prior_is_per_particle_normal():
    layer = bk.layers.Dense(
        3, num_particles=4, kernel_prior=bk.priors.Normal(scale=2.0), bias_prior=0.5
    )
    layer.build((None, 5))
    k, b = layer.kernel.numpy(), layer.bias.numpy()

    def lp(w, s):
        return np.sum(
            -0.5 * (w / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi), axis=tuple(range(1, w.ndim))
        )

    np.testing.assert_allclose(layer.log_prior().numpy(), lp(k, 2.0) + lp(b, 0.5), rtol=1e-5)
    he = bk.priors.Normal(scale="he")
    assert abs(he.stddev(50) - np.sqrt(2 / 50)) < 1e-12


def test_bad_priors_and_arguments():
    with pytest.raises(ValueError, match="positive"):
        bk.priors.Normal(scale=-1.0)
    with pytest.raises(ValueError, match="Expected a prior"):
        bk.layers.Dense(3, kernel_prior="wide")
    with pytest.raises(ValueError, match="units"):
        bk.layers.Dense(0)
    with pytest.raises(ValueError, match="channels_last"):
        bk.layers.Conv2D(3, 3, data_format="channels_first")
    with pytest.raises(ValueError, match="given num_particles"):
        bk.layers.Conv2D(3, 3, num_particles=2)(np.zeros((1, 2, 8, 8, 1), np.float32))


def test_layer_configs_round_trip():
    for layer in [
        bk.layers.Dense(
            3, activation="relu", num_particles=2, kernel_prior=bk.priors.Normal(0.1, "he:2")
        ),
        bk.layers.Conv2D(4, (3, 2), strides=2, padding="same", deterministic=True),
        bk.layers.MaxPooling2D(3),
        bk.layers.AveragePooling2D(2),
        bk.layers.Flatten(),
    ]:
        clone = layer.__class__.from_config(layer.get_config())
        assert clone.get_config() == layer.get_config()
    clone = keras_round_trip(bk.layers.Dense(3, kernel_prior=0.3), None)
    assert clone.kernel_prior.scale == 0.3
