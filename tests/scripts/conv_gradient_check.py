"""Gradients of every particle-conv configuration (Conv2D, Conv1D) against per-particle Keras layers.

Run in a subprocess by tests/layers/test_conv_portability.py with TF_ENABLE_ONEDNN_OPTS=0 and =1 (the
variable only acts before TensorFlow is imported). Prints one line per case and "ALL OK" at the end;
exits non-zero on the first mismatch or error. The per-particle Keras references run in float64, whose
CPU kernels are TensorFlow's own under either setting: with oneDNN on, its float32 filter gradient of a
1x1 stride-2 'same' convolution on an 8x8 input came out wrong in one input channel on CPUs without
AVX-512 (TF 2.20), so a float32 reference would test our layer against a wrong answer.
Usage: python conv_gradient_check.py [auto|native|portable]
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402
from bayes_keras.layers import grouped_convolution  # noqa: E402

N = 3
CASES = [  # (kernel_size, strides, dilation_rate, padding, input H, W)
    (3, 1, 1, "same", 7, 7),
    (3, 1, 1, "valid", 7, 7),
    (3, 2, 1, "same", 9, 8),
    ((2, 3), 2, 1, "valid", 9, 8),
    (3, (1, 2), 1, "same", 6, 7),
    (3, 1, 2, "same", 9, 9),
    ((3, 2), 1, (2, 1), "valid", 9, 8),
    (5, 1, 1, "same", 4, 4),
    (1, 2, 1, "same", 8, 8),  # ResNet's 1x1 stride-2 shortcut
    (2, 3, 1, "valid", 10, 11),  # kernel narrower than the stride: phases no tap meets
    ((1, 3), (3, 2), 1, "same", 7, 9),
]


def _particle(t, n):
    """Particle n of a (batch, H, W, N, C) image or of a (batch, N, T, C) sequence."""
    return t[:, :, :, n] if len(t.shape) == 5 else t[:, n]


def compare_to_keras(layer, make_reference, x, case):
    """One loss, sum(tanh(y) * target), through the particle layer and through one plain Keras layer
    per particle (its weights = the particle's slice, or the shared weights of a deterministic layer,
    whose gradient is then the sum over particles): input, kernel and bias gradients must agree.
    `x` is (batch, H, W, N, C) or (batch, N, T, C)."""
    target = tf.constant(np.random.default_rng(2).standard_normal(layer(x).shape), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.tanh(layer(x)) * target)
    dx, dk, db = tape.gradient(loss, [x, layer.kernel, layer.bias])
    shared = layer.deterministic
    ref_dk, ref_db = 0.0, 0.0
    for n in range(N):
        ref = make_reference()
        xn = tf.cast(_particle(x, n), tf.float64)
        ref.build((None,) + tuple(xn.shape[1:]))
        ref.set_weights(
            [layer.kernel.numpy(), layer.bias.numpy()]
            if shared
            else [layer.kernel.numpy()[n], layer.bias.numpy()[n]]
        )
        with tf.GradientTape() as tape:
            tape.watch(xn)
            loss_n = tf.reduce_sum(tf.tanh(ref(xn)) * tf.cast(_particle(target, n), tf.float64))
        rdx, rdk, rdb = tape.gradient(loss_n, [xn, ref.kernel, ref.bias])
        np.testing.assert_allclose(
            _particle(dx, n).numpy(),
            rdx.numpy(),
            rtol=1e-4,
            atol=1e-4,
            err_msg=f"dx of particle {n} in case {case}",
        )
        if shared:
            ref_dk, ref_db = ref_dk + rdk.numpy(), ref_db + rdb.numpy()
            continue
        for name, got, want in (("dkernel", dk[n], rdk), ("dbias", db[n], rdb)):
            np.testing.assert_allclose(
                got.numpy(),
                want.numpy(),
                rtol=1e-4,
                atol=1e-4,
                err_msg=f"{name} of particle {n} in case {case}",
            )
    if shared:
        np.testing.assert_allclose(
            dk.numpy(), ref_dk, rtol=1e-4, atol=1e-4, err_msg=f"shared dkernel in {case}"
        )
        np.testing.assert_allclose(
            db.numpy(), ref_db, rtol=1e-4, atol=1e-4, err_msg=f"shared dbias in {case}"
        )


def check(case, deterministic=False):
    kernel_size, strides, dilation, padding, height, width = case
    x = tf.constant(np.random.default_rng(0).standard_normal((2, height, width, N, 3)), tf.float32)
    args = dict(strides=strides, dilation_rate=dilation, padding=padding)
    compare_to_keras(
        bk.layers.Conv2D(4, kernel_size, deterministic=deterministic, **args),
        lambda: keras.layers.Conv2D(4, kernel_size, dtype="float64", **args),
        x,
        case + (deterministic,),
    )


CASES_1D = [  # (kernel_size, strides, dilation_rate, padding, steps)
    (3, 1, 1, "same", 9),
    (3, 2, 1, "valid", 10),
    (2, 1, 3, "causal", 9),
]


def check_conv1d(case):
    kernel_size, strides, dilation, padding, steps = case
    x = tf.constant(np.random.default_rng(0).standard_normal((2, N, steps, 3)), tf.float32)
    args = dict(strides=strides, dilation_rate=dilation, padding=padding)
    compare_to_keras(
        bk.layers.Conv1D(4, kernel_size, **args),
        lambda: keras.layers.Conv1D(4, kernel_size, dtype="float64", **args),
        x,
        ("Conv1D",) + case,
    )


def check_first_layer(dilation):
    """The layer that starts the particle axis (one ungrouped convolution with N*F filters): its
    kernel gradients, dilated or not, against Keras per particle."""
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((2, 9, 9, 3)), tf.float32)
    layer = bk.layers.Conv2D(4, 3, dilation_rate=dilation, padding="same", num_particles=N)
    target = tf.constant(rng.standard_normal(layer(x).shape), tf.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.tanh(layer(x)) * target)
    dk, db = tape.gradient(loss, [layer.kernel, layer.bias])
    for n in range(N):
        ref = keras.layers.Conv2D(4, 3, dilation_rate=dilation, padding="same", dtype="float64")
        ref.build((None, 9, 9, 3))
        ref.set_weights([layer.kernel.numpy()[n], layer.bias.numpy()[n]])
        with tf.GradientTape() as tape:
            loss_n = tf.reduce_sum(
                tf.tanh(ref(tf.cast(x, tf.float64))) * tf.cast(_particle(target, n), tf.float64)
            )
        rdk, rdb = tape.gradient(loss_n, [ref.kernel, ref.bias])
        np.testing.assert_allclose(
            dk[n].numpy(),
            rdk.numpy(),
            rtol=1e-4,
            atol=1e-4,
            err_msg=f"first-layer dkernel of particle {n}, dilation {dilation}",
        )
        np.testing.assert_allclose(db[n].numpy(), rdb.numpy(), rtol=1e-4, atol=1e-4)


def train_one_step():
    """The crash users saw: one fit step of a model whose second particle Conv2D is grouped."""
    model = bk.zoo.lenet5((8, 8, 1), 10, num_particles=N)
    model.compile(optimizer=bk.optimizers.IndependentParticles(1e-3))
    x = np.random.default_rng(1).standard_normal((16, 8, 8, 1)).astype(np.float32)
    y = np.arange(16) % 10
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]), history.history
    # inference graph: Grappler may fuse a convolution with the bias add and relu that follow it
    assert np.all(np.isfinite(model.predict(x, verbose=0)))
    # grouped conv -> batch norm -> relu, trained and then predicted: in inference Grappler folds a fused batch
    # norm after a convolution into _FusedConv2D, which the Eigen CPU kernels refuse for groups > 1
    inputs = keras.Input((8, 8, 1))
    h = bk.layers.Conv2D(4, 3, padding="same", use_bias=False, num_particles=N)(inputs)
    for _ in range(2):
        h = bk.layers.Conv2D(4, 3, padding="same", use_bias=False)(h)
        h = keras.layers.Activation("relu")(bk.layers.BatchNormalization()(h))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(10)(bk.layers.GlobalAveragePooling2D()(h)), likelihood="categorical"
    )
    model.compile(optimizer=bk.optimizers.IndependentParticles(1e-3))
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]), history.history
    assert np.all(np.isfinite(model.predict(x, verbose=0)))


if __name__ == "__main__":
    grouped_convolution.set_gradient_implementation(sys.argv[1] if len(sys.argv) > 1 else "auto")
    print("gradient implementation:", grouped_convolution.gradient_implementation())
    for case in CASES:
        check(case)
        print("ok", case)
    for case in CASES[:3] + CASES[5:6]:
        check(case, deterministic=True)  # a shared kernel after a particle layer: N equal groups
        print("ok shared kernel", case)
    for dilation in (1, 2):
        check_first_layer(dilation)
        print("ok first layer, dilation", dilation)
    for case in CASES_1D:
        check_conv1d(case)
        print("ok Conv1D", case)
    train_one_step()
    print("ok fit")
    print("ALL OK")
