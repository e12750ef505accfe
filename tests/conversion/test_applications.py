"""Every keras.applications constructor converts exactly: built with weights=None at the smallest input it
accepts and a 10-class head, with noise_std=0 every particle predicts as the Keras model (1e-5), in inference and
in training mode, in memory and after a .keras round trip. BatchNormalization statistics are randomised first
(weights=None leaves mean 0 and variance 1, which would hide statistics dropped by the conversion), and every
Dropout rate is set to 0 so that training mode is deterministic on both sides.

The smallest member of each family runs by default (three of them also through a .keras file); every other
constructor, and the round trip of the other ten families, under `-m slow`. The outcomes are listed in
docs/transfer_learning.md."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk

# constructor -> the smallest square input it accepts
SMALLEST = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71, "NASNetLarge": 32}
FAMILIES = [
    "ConvNeXtTiny",
    "DenseNet121",
    "EfficientNetB0",
    "EfficientNetV2B0",
    "InceptionResNetV2",
    "InceptionV3",
    "MobileNet",
    "MobileNetV2",
    "MobileNetV3Small",
    "NASNetMobile",
    "ResNet50",
    "ResNet50V2",
    "VGG16",
    "Xception",
]
EVERY = sorted(name for name in dir(keras.applications) if name[0].isupper())


def _keras_model(name):
    keras.utils.set_random_seed(0)
    size = SMALLEST.get(name, 32)
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10)
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            shape = tuple(layer.moving_mean.shape)
            layer.moving_mean.assign(0.1 * rng.standard_normal(shape).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.5, 1.5, shape).astype("float32"))
    _without_dropout(model)
    return model, size


def _without_dropout(model):
    """Every Dropout rate set to 0, so that training mode is deterministic."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0


def _float64_twin(name, model):
    """The same Keras model computing in float64 (the exact reference for float32 rounding)."""
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        twin = getattr(keras.applications, name)(
            weights=None, input_shape=model.input_shape[1:], classes=10
        )
    finally:
        keras.config.set_dtype_policy(policy)
    _without_dropout(twin)
    twin.set_weights([w.astype("float64") for w in model.get_weights()])
    return twin


# Families whose default run also makes the .keras round trip: DepthwiseConv2D, Conv2D with groups, Dense on
# images, BatchNormalization's axis read in the Keras rank, re-created keras.ops nodes, LayerScale kept shared
# (every particle layer's own round trip, SeparableConv2D's included, is in tests/layers/test_keras_layer_harness.py).
# Under -m slow every constructor makes it.
ROUND_TRIP = {"ConvNeXtTiny", "MobileNetV3Small", "ResNet50"}


def _check_exact(name, tmp_path, round_trip=True):
    model, size = _keras_model(name)
    x = np.random.default_rng(1).uniform(0, 255, (4, size, size, 3)).astype("float32")
    converted = bk.bayesianize(model, num_particles=2, noise_std=0.0)
    report = bk.conversion_report(converted)
    # every weight layer has a particle twin but ConvNeXt's LayerScale (a per-channel scale, kept shared and named)
    shared = {type(converted.get_layer(name)).__name__ for name in report.shared_layers}
    assert shared <= {"PerParticle", "LayerScale"}, report
    assert all("layer_scale" in name for name in report.shared_layers), report.shared_layers
    # Training mode normalises with batch statistics, whose float32 rounding (a fused op per particle here, Keras'
    # own formula there) 50-100 BatchNormalization layers amplify on a batch of 4: measured up to 7e-4, so it
    # is held to 2e-3; inference mode, where a dropped or misplaced statistic would show, to 1e-5.
    for training, atol in ((False, 1e-5), (True, 2e-3)):
        expected = model(x, training=training).numpy()
        logits = converted(x, training=training).numpy()
        if np.max(np.abs(tf.nn.softmax(logits).numpy() - expected[:, None])) > atol:
            _within_float32_rounding(name, model, x, logits, training)
        if (
            round_trip and not training
        ):  # saved before the training-mode call moves the BatchNormalization averages
            path = os.path.join(tmp_path, f"{name}.keras")
            converted.save(path)
            loaded = keras.models.load_model(path)
            np.testing.assert_allclose(
                tf.nn.softmax(loaded(x)).numpy(), tf.nn.softmax(logits).numpy(), atol=1e-6
            )


def _keras_logits(model, x, training):
    head = model.layers[-1]  # Dense(classes, activation="softmax")
    features = keras.Model(model.input, head.input)(x, training=training).numpy()
    return features @ head.kernel.numpy() + head.bias.numpy()


def _within_float32_rounding(name, model, x, logits, training):
    """Where float32 rounding alone takes the Keras model's output beyond the tolerance (the deepest members at
    random weights: EfficientNetB5-B7 and V2S-L, ResNet101 / 152 in training mode, batch statistics of 4 numbers
    on 1x1 maps; EfficientNetV2L's inference logits reach 2e4 and move by their own size in float32), the
    converted model must be about as close to the exact answer, the same Keras model in float64, as Keras' own
    float32 output is: within 4 times the largest error of Keras' float32 output on the batch in 3 orders (each
    order rounds the batch statistics differently; logits relative to their largest magnitude)."""
    exact = _keras_logits(_float64_twin(name, model), x.astype("float64"), training)
    scale = np.max(np.abs(exact))
    keras_error = 0.0
    for order in (np.arange(len(x)), np.arange(len(x))[::-1], np.roll(np.arange(len(x)), 1)):
        keras32 = _keras_logits(model, x[order], training)[np.argsort(order)]
        keras_error = max(keras_error, np.max(np.abs(keras32 - exact)) / scale)
    error = np.max(np.abs(logits - exact[:, None])) / scale
    assert keras_error > 1e-4, (
        f"{name}, training={training}: Keras' float32 output is exact, ours is {error:.2e} off"
    )
    assert error <= 4 * keras_error, (
        f"{name}, training={training}: {error:.2e} from float64, Keras' {keras_error:.2e}"
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_smallest_of_each_family_converts_exactly(name, tmp_path):
    _check_exact(name, tmp_path, round_trip=name in ROUND_TRIP)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [n for n in EVERY if n not in FAMILIES] + sorted(set(FAMILIES) - ROUND_TRIP)
)
def test_every_constructor_converts_exactly(name, tmp_path):
    _check_exact(name, tmp_path)
