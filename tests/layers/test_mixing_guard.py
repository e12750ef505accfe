"""Plain Keras layers that would mix particles or drop the particle axis are refused when the model is
built, naming the layer to use; layers that act per particle keep working."""

import keras
import numpy as np
import pytest

import bayes_keras as bk

N = 3


def _image_model(middle):
    inputs = keras.Input((8, 8, 1))
    h = middle(bk.layers.Conv2D(4, 3, padding="same", num_particles=N)(inputs))
    h = bk.layers.Flatten()(h) if len(h.shape) > 3 else h
    return bk.BayesianModel(inputs, bk.layers.Dense(10)(h), likelihood="categorical")


def _sequence_model(middle):
    inputs = keras.Input((6, 5))
    h = middle(bk.layers.Dense(8, num_particles=N)(inputs))  # (batch, N, 6, 8)
    h = bk.layers.GlobalAveragePooling1D()(h) if len(h.shape) == 4 else h
    return bk.BayesianModel(inputs, bk.layers.Dense(10)(h), likelihood="categorical")


@pytest.mark.parametrize(
    "build,layer,expected",
    [
        (
            _image_model,
            lambda: keras.layers.BatchNormalization(),
            "bayes_keras.layers.BatchNormalization",
        ),
        (_image_model, lambda: keras.layers.GroupNormalization(2), "LayerNormalization"),
        (
            _sequence_model,
            lambda: lambda h: keras.layers.MultiHeadAttention(2, 4)(h, h),
            "attention",
        ),
    ],
)
def test_layers_that_mix_particles_are_refused(build, layer, expected):
    with pytest.raises(ValueError, match=f"would mix the particles.*{expected}"):
        build(layer())


def test_keras_pooling_that_eats_the_particle_axis_is_refused():
    inputs = keras.Input((5,))
    h = bk.layers.Dense(8, num_particles=N)(inputs)  # (batch, N, 8): Keras' GAP1D would pool over N
    h = keras.layers.GlobalAveragePooling1D()(h)
    with pytest.raises(ValueError, match="bayes_keras.layers.GlobalAveragePooling1D"):
        bk.BayesianModel(inputs, keras.layers.Dense(10)(h), likelihood="categorical")


@pytest.mark.parametrize(
    "layer",
    [
        lambda: keras.layers.LayerNormalization(),
        lambda: keras.layers.Dropout(0.1),
        lambda: keras.layers.Activation("relu"),
        lambda: keras.layers.Dense(4),
    ],
)
def test_layers_that_act_per_particle_keep_working(layer):
    model = _image_model(layer())
    x = np.random.default_rng(0).standard_normal((5, 8, 8, 1)).astype(np.float32)
    assert model.predict_particles(x).shape == (5, N, 10)


def test_keras_add_and_concatenate_keep_working():
    inputs = keras.Input((5,))
    a = bk.layers.Dense(4, num_particles=N)(inputs)
    b = bk.layers.Dense(4, num_particles=N)(inputs)
    h = keras.layers.Concatenate()([keras.layers.Add()([a, b]), a])
    model = bk.BayesianModel(inputs, bk.layers.Dense(2)(h), likelihood="categorical")
    assert model.predict_particles(np.zeros((2, 5), np.float32)).shape == (2, N, 2)


@pytest.mark.parametrize(
    "layer,axis_message",
    [
        (lambda: keras.layers.Softmax(axis=1, name="over_particles"), True),
        (lambda: keras.layers.LayerNormalization(axis=1, name="over_particles"), True),
        (lambda: keras.layers.Concatenate(axis=1, name="over_particles"), True),
        (lambda: keras.layers.Attention(name="over_particles"), False),
        (lambda: keras.layers.AdditiveAttention(name="over_particles"), False),
    ],
)
def test_layers_acting_across_the_particle_axis_are_refused(layer, axis_message):
    """These were accepted by the old deny-list, and moving one particle's weights moved the others' outputs."""
    inputs = keras.Input((5,))
    h = bk.layers.Dense(4, num_particles=N)(inputs)  # (batch, N, 4): axis 1 is the particle axis
    layer = layer()
    h = (
        layer([h, h])
        if isinstance(
            layer,
            (keras.layers.Concatenate, keras.layers.Attention, keras.layers.AdditiveAttention),
        )
        else layer(h)
    )
    with pytest.raises(
        ValueError, match="over_particles.*" + ("particle axis" if axis_message else "PerParticle")
    ):
        bk.BayesianModel(inputs, bk.layers.Dense(2)(h), likelihood="categorical")


def test_the_same_layers_on_other_axes_or_per_particle_are_accepted_and_keep_particles_apart():
    inputs = keras.Input((6, 3))
    first = bk.layers.Dense(4, num_particles=N)
    h = first(inputs)  # (batch, N, 6, 4)
    h = keras.layers.Softmax(axis=2)(h)  # over the 6 steps
    h = keras.layers.LayerNormalization(axis=[2, 3])(h)
    h = bk.layers.PerParticle(keras.layers.Attention())(
        [h, h]
    )  # attention over the steps, per particle
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(2)(bk.layers.GlobalAveragePooling1D()(h)), likelihood="categorical"
    )
    x = np.random.default_rng(0).standard_normal((3, 6, 3)).astype(np.float32)
    before = np.asarray(model(x))
    first.kernel.assign(first.kernel.numpy() + np.eye(N)[:, :1, None])  # particle 0 only
    after = np.asarray(model(x))
    np.testing.assert_array_equal(before[:, 1:], after[:, 1:])
    assert not np.array_equal(before[:, 0], after[:, 0])


def test_keras_ops_across_the_particle_axis_are_refused_elementwise_ones_accepted():
    inputs = keras.Input((5,))
    h = bk.layers.Dense(4, num_particles=N)(inputs)
    with pytest.raises(ValueError, match="operation.*PerParticle"):
        bk.BayesianModel(
            inputs,
            bk.layers.Dense(2)(h - keras.ops.mean(h, axis=1, keepdims=True)),
            likelihood="categorical",
        )
    with pytest.raises(ValueError, match="operation"):
        bk.BayesianModel(
            inputs,
            bk.layers.Dense(2)(h - keras.ops.mean(h, axis=0, keepdims=True)),
            likelihood="categorical",
        )
    model = bk.BayesianModel(
        inputs,
        bk.layers.Dense(2)(2.0 * h + 1.0 - keras.ops.mean(h, axis=-1, keepdims=True)),
        likelihood="categorical",
    )
    assert model.predict_particles(np.zeros((2, 5), np.float32)).shape == (2, N, 2)
