"""Conv1D and global pooling particle layers against per-particle loops of the Keras layers."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk

N = 3


@pytest.mark.parametrize(
    "kernel_size,strides,dilation,padding",
    [
        (3, 1, 1, "valid"),
        (3, 1, 1, "same"),
        (3, 1, 2, "causal"),
        (2, 1, 3, "same"),
        (2, 2, 1, "same"),
        (4, 3, 1, "same"),
        (2, 2, 1, "valid"),
    ],
)
def test_conv1d_equals_keras_conv1d_per_particle(kernel_size, strides, dilation, padding):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((2, 11, 4)), tf.float32)  # (batch, T, C)
    first = bk.layers.Conv1D(
        5,
        kernel_size,
        strides=strides,
        dilation_rate=dilation,
        padding=padding,
        activation="tanh",
        num_particles=N,
    )
    second = bk.layers.Conv1D(
        2, kernel_size, strides=strides, dilation_rate=dilation, padding=padding
    )
    with tf.GradientTape() as tape:
        h = first(x)
        y = second(h)
        loss = tf.reduce_sum(tf.sin(y))
    grads = tape.gradient(loss, [first.kernel, second.kernel, second.bias])
    assert tuple(first.compute_output_shape((None, 11, 4)))[1:] == tuple(h.shape[1:])
    assert tuple(second.compute_output_shape(h.shape)) == tuple(y.shape)
    # The reference runs undilated: a dilated kernel equals a kernel of span (k - 1) d + 1 with zeros
    # between its taps (Keras' own dilated Conv1D has no gradient on CPUs without oneDNN).
    span = (kernel_size - 1) * dilation + 1

    def spread(kernel):
        wide = np.zeros((span,) + kernel.shape[1:], kernel.dtype)
        wide[::dilation] = kernel
        return wide

    for n in range(N):
        k1 = keras.layers.Conv1D(5, span, strides=strides, padding=padding, activation="tanh")
        k2 = keras.layers.Conv1D(2, span, strides=strides, padding=padding)
        k1.build((None, 11, 4))
        k1.set_weights([spread(first.kernel.numpy()[n]), first.bias.numpy()[n]])
        k2.build(k1.compute_output_shape((None, 11, 4)))
        k2.set_weights([spread(second.kernel.numpy()[n]), second.bias.numpy()[n]])
        with tf.GradientTape() as tape:
            ref = k2(k1(x))
            ref_loss = tf.reduce_sum(tf.sin(ref))
        ref_grads = tape.gradient(ref_loss, [k1.kernel, k2.kernel, k2.bias])
        ref_grads = [ref_grads[0][::dilation], ref_grads[1][::dilation], ref_grads[2]]
        np.testing.assert_allclose(y[:, n], ref, rtol=1e-4, atol=1e-5)
        for got, want in zip(grads, ref_grads):
            np.testing.assert_allclose(got[n], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "ours,theirs,shape",
    [
        (bk.layers.GlobalAveragePooling1D, keras.layers.GlobalAveragePooling1D, (2, N, 7, 4)),
        (bk.layers.GlobalMaxPooling1D, keras.layers.GlobalMaxPooling1D, (2, N, 7, 4)),
        (
            bk.layers.GlobalAveragePooling2D,
            keras.layers.GlobalAveragePooling2D,
            (2, 5, 6, N, 4),
        ),  # images (B, H, W, N, C)
        (bk.layers.GlobalMaxPooling2D, keras.layers.GlobalMaxPooling2D, (2, 5, 6, N, 4)),
    ],
)
@pytest.mark.parametrize("keepdims", [False, True])
def test_global_pooling_equals_keras_per_particle(ours, theirs, shape, keepdims):
    x = tf.constant(np.random.default_rng(1).standard_normal(shape), tf.float32)
    layer = ours(keepdims=keepdims)
    y = layer(x)
    assert tuple(layer.compute_output_shape(x.shape)) == tuple(y.shape)
    image = len(shape) == 5
    for n in range(N):
        want = theirs(keepdims=keepdims)(x[:, :, :, n] if image else x[:, n])
        got = y[:, :, :, n] if image and keepdims else y[:, n]
        np.testing.assert_allclose(got, want, rtol=1e-6)
    clone = ours.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


def test_global_average_pooling_1d_respects_a_mask():
    x = tf.constant(np.random.default_rng(2).standard_normal((2, N, 6, 3)), tf.float32)
    mask = tf.constant([[True, True, True, False, False, False], [True] * 6])
    y = bk.layers.GlobalAveragePooling1D()(x, mask=mask)
    for n in range(N):
        np.testing.assert_allclose(
            y[:, n], keras.layers.GlobalAveragePooling1D()(x[:, n], mask=mask), rtol=1e-6
        )


def test_a_conv1d_model_keeps_particles_independent_and_trains():
    (x, y), _ = bk.datasets.load_digits()
    x = x.reshape(len(x), 8, 8)[:128]  # rows as 8 steps of 8 features
    y = y[:128]
    inputs = keras.Input((8, 8))
    h = bk.layers.Conv1D(8, 3, padding="causal", activation="relu", num_particles=N)(inputs)
    h = bk.layers.Conv1D(8, 3, strides=2, activation="relu")(h)
    h = bk.layers.GlobalAveragePooling1D()(h)
    model = bk.BayesianModel(inputs, bk.layers.Dense(10)(h), likelihood="categorical")
    before = model.predict_particles(x[:16])
    second = model.layers[2]
    kernel = second.kernel.numpy()
    kernel[0] += 0.5  # particle 0 only
    second.kernel.assign(kernel)
    after = model.predict_particles(x[:16])
    assert not np.allclose(after[:, 0], before[:, 0])
    np.testing.assert_array_equal(after[:, 1:], before[:, 1:])
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2, structure="layer"))
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0)
    assert (
        np.all(np.isfinite(history.history["loss"]))
        and history.history["loss"][-1] < history.history["loss"][0]
    )


def test_conv1d_config_and_bad_arguments():
    layer = bk.layers.Conv1D(4, 3, strides=2, padding="causal", num_particles=2, kernel_prior=0.5)
    clone = bk.layers.Conv1D.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="padding"):
        bk.layers.Conv1D(4, 3, padding="full")
    with pytest.raises(ValueError, match="strides > 1 together with dilation_rate > 1"):
        bk.layers.Conv1D(4, 3, strides=2, dilation_rate=2)
    with pytest.raises(ValueError, match="given num_particles"):
        bk.layers.Conv1D(4, 3, num_particles=2)(np.zeros((1, 2, 8, 3), np.float32))
