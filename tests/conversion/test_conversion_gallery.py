"""bayesianize on a gallery of users' Keras models: each converted model predicts exactly as the Keras model
(every particle, noise_std=0), in memory and after a .keras round trip, or a ValueError names the layer.
No third outcome."""

import warnings

import keras
import numpy as np
import pytest

import bayes_keras as bk

L = keras.layers
N = 3
RNG = np.random.default_rng(0)


@keras.saving.register_keras_serializable(package="gallery")
class Scale(L.Layer):
    """A custom per-example layer: x * exp(s) + x^2 / 10, s a weight."""

    def build(self, shape):
        self.s = self.add_weight(shape=(shape[-1],), initializer="zeros")

    def call(self, x):
        return x * keras.ops.exp(self.s) + x * x / 10.0


@keras.saving.register_keras_serializable(package="gallery")
class CenterBatch(L.Layer):
    """A custom layer that couples the examples of a batch."""

    def call(self, x):
        return x - keras.ops.mean(x, axis=0, keepdims=True)


def _images(n=8, size=8, channels=1):
    return RNG.standard_normal((n, size, size, channels)).astype("float32")


def _table(n=8, d=6):
    return (RNG.standard_normal((n, d)) * 2 + 1).astype("float32")


def _sequences(n=8, t=7, d=4):
    return RNG.standard_normal((n, t, d)).astype("float32")


def _tokens(n=8, t=7, vocabulary=12):
    ids = RNG.integers(1, vocabulary, (n, t))
    ids[:, 5:] = 0  # padding
    ids[0, 2:] = 0
    return ids.astype("int32")


def _head(h, kind):
    if kind == "categorical":
        return L.Dense(3, activation="softmax")(h)
    if kind == "bernoulli":
        return L.Dense(1, activation="sigmoid")(h)
    return L.Dense(1)(h)


def mlp():
    return keras.Sequential(
        [keras.Input((6,)), L.Dense(8, activation="relu"), L.Dense(3, activation="softmax")]
    ), _table()


def flatten_first_mlp():
    return keras.Sequential(
        [
            keras.Input((4, 4)),
            L.Flatten(),
            L.Dense(8, activation="relu"),
            L.Dense(3, activation="softmax"),
        ]
    ), _sequences(t=4)


def cnn():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            L.Conv2D(4, 3, padding="same", activation="relu"),
            L.MaxPooling2D(),
            L.Conv2D(6, 3, activation="relu"),
            L.Flatten(),
            L.Dense(3, activation="softmax"),
        ]
    ), _images()


def cnn_batchnorm_dropout():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            L.Conv2D(4, 3, padding="same"),
            L.BatchNormalization(),
            L.Activation("relu"),
            L.Dropout(0.3),
            L.AveragePooling2D(2),
            L.Conv2D(5, 3),
            L.BatchNormalization(),
            L.ReLU(),
            L.GlobalAveragePooling2D(),
            L.Dense(3, activation="softmax"),
        ]
    ), _images()


def cnn_normalization_rescaling():
    x = _images() * 3 + 2
    norm = L.Normalization()
    norm.adapt(x)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            L.Rescaling(0.5, offset=0.1),
            norm,
            L.Conv2D(4, 3, activation="relu"),
            L.GlobalMaxPooling2D(),
            L.Dense(3, activation="softmax"),
        ]
    ), x


def tabular_normalization():
    x = _table()
    norm = L.Normalization()
    norm.adapt(x)
    return keras.Sequential([keras.Input((6,)), norm, L.Dense(8, activation="tanh"), L.Dense(1)]), x


def batchnorm_on_inputs():
    return keras.Sequential(
        [
            keras.Input((6,)),
            L.BatchNormalization(),
            L.Dense(8, activation="relu"),
            L.Dense(1, activation="sigmoid"),
        ]
    ), _table()


def residual_cnn():
    inputs = keras.Input((8, 8, 1))
    h = L.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    r = L.Conv2D(4, 3, padding="same")(h)
    r = L.BatchNormalization()(r)
    h = L.Activation("relu")(L.Add()([h, r]))
    h = L.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, _head(h, "categorical")), _images()


def residual_mlp():
    inputs = keras.Input((6,))
    h = L.Dense(8, activation="relu")(inputs)
    h = L.Add()([h, L.Dense(8)(h)])
    h = L.LayerNormalization()(h)
    return keras.Model(inputs, _head(h, "normal")), _table()


def two_inputs():
    a, b = keras.Input((6,)), keras.Input((7, 4))
    h = L.Concatenate()(
        [L.Dense(5, activation="relu")(a), L.GlobalAveragePooling1D()(L.Dense(5)(b))]
    )
    return keras.Model([a, b], _head(h, "categorical")), [_table(), _sequences()]


def concatenate_input_with_particles():
    inputs = keras.Input((6,))
    h = L.Concatenate()(
        [L.Dense(5, activation="relu")(inputs), inputs]
    )  # one side has no particle axis
    return keras.Model(inputs, _head(h, "normal")), _table()


def concatenate_time_axis():
    inputs = keras.Input((7, 4))
    h = L.Dense(5)(inputs)
    h = L.Concatenate(axis=1)([h, L.Dense(5)(h)])
    h = L.GlobalMaxPooling1D()(h)
    return keras.Model(inputs, _head(h, "categorical")), _sequences()


def softmax_attention_pooling():
    inputs = keras.Input((7, 4))
    h = L.Dense(6, activation="tanh")(inputs)
    weights = L.Softmax(axis=1)(L.Dense(1)(h))  # over time
    h = L.GlobalAveragePooling1D()(L.Multiply()([h, weights]))
    return keras.Model(inputs, _head(h, "categorical")), _sequences()


def softmax_last_axis():
    inputs = keras.Input((7, 4))
    h = L.Softmax(axis=-1)(L.Dense(6)(inputs))
    return keras.Model(inputs, _head(L.Flatten()(h), "normal")), _sequences()


def layer_normalization_axes():
    inputs = keras.Input((7, 4))
    h = L.Dense(6)(inputs)
    h = L.LayerNormalization(axis=1)(h)
    h = L.LayerNormalization(axis=[1, 2])(h)
    h = L.LayerNormalization(axis=-1)(h)
    return keras.Model(inputs, _head(L.GlobalAveragePooling1D()(h), "categorical")), _sequences()


def masked_embedding_lstm():
    return keras.Sequential(
        [
            keras.Input((7,), dtype="int32"),
            L.Embedding(12, 4, mask_zero=True),
            L.LSTM(5),
            L.Dense(3, activation="softmax"),
        ]
    ), _tokens()


def masked_embedding_gru_sequences():
    return keras.Sequential(
        [
            keras.Input((7,), dtype="int32"),
            L.Embedding(12, 4, mask_zero=True),
            L.GRU(5, return_sequences=True),
            L.GlobalAveragePooling1D(),
            L.Dense(1, activation="sigmoid"),
        ]
    ), _tokens()


def masked_embedding_bidirectional():
    return keras.Sequential(
        [
            keras.Input((7,), dtype="int32"),
            L.Embedding(12, 4, mask_zero=True),
            L.Bidirectional(L.LSTM(5)),
            L.Dense(3, activation="softmax"),
        ]
    ), _tokens()


def simple_rnn_sequences():
    return keras.Sequential(
        [keras.Input((7, 4)), L.SimpleRNN(5, return_sequences=True), L.SimpleRNN(4), L.Dense(1)]
    ), _sequences()


def conv1d_regressor():
    return keras.Sequential(
        [
            keras.Input((7, 4)),
            L.Conv1D(6, 3, padding="same", activation="relu"),
            L.MaxPooling1D(2),
            L.Conv1D(4, 2, activation="relu"),
            L.GlobalAveragePooling1D(),
            L.Dense(1),
        ]
    ), _sequences()


def custom_per_example_layer():
    inputs = keras.Input((6,))
    h = Scale()(L.Dense(8, activation="relu")(inputs))
    return keras.Model(inputs, _head(h, "normal")), _table()


def reshape_to_image():
    return keras.Sequential(
        [
            keras.Input((6,)),
            L.Dense(16, activation="relu"),
            L.Reshape((4, 4, 1)),
            L.Conv2D(3, 3, padding="same"),
            L.ZeroPadding2D(1),
            L.UpSampling2D(),
            L.Flatten(),
            L.Dense(3, activation="softmax"),
        ]
    ), _table()


def attention_and_group_norm():
    inputs = keras.Input((7, 4))
    h = L.Dense(8)(inputs)
    h = L.MultiHeadAttention(2, 4)(h, h)
    h = L.GroupNormalization(2)(h)
    return keras.Model(inputs, _head(L.GlobalAveragePooling1D()(h), "categorical")), _sequences()


def prelu_permute_dot():
    inputs = keras.Input((7, 4))
    h = L.PReLU()(L.Dense(5)(inputs))
    p = L.Permute((2, 1))(h)  # (5, 7)
    h = L.Dot(axes=(2, 1))([h, p])  # (7, 7)
    return keras.Model(inputs, _head(L.Flatten()(h), "normal")), _sequences()


def separate_softmax_output():
    return keras.Sequential(
        [keras.Input((6,)), L.Dense(8, activation="relu"), L.Dense(3), L.Softmax()]
    ), _table()


def time_distributed_dense():
    return keras.Sequential(
        [
            keras.Input((7, 4)),
            L.LSTM(5, return_sequences=True),
            L.TimeDistributed(L.Dense(2)),
            L.Flatten(),
            L.Dense(1),
        ]
    ), _sequences()


def masked_merge():
    """A merge where Keras applies the Embedding's (batch, T) mask to its inputs."""
    inputs = keras.Input((7,), dtype="int32")
    h = L.LSTM(5, return_sequences=True)(L.Embedding(12, 4, mask_zero=True)(inputs))
    h = L.Multiply()([h, L.Dense(5, activation="relu")(h)])
    return keras.Model(inputs, _head(L.GlobalAveragePooling1D()(h), "bernoulli")), _tokens()


CONVERTED = [
    mlp,
    flatten_first_mlp,
    cnn,
    cnn_batchnorm_dropout,
    cnn_normalization_rescaling,
    tabular_normalization,
    batchnorm_on_inputs,
    residual_cnn,
    residual_mlp,
    two_inputs,
    concatenate_input_with_particles,
    concatenate_time_axis,
    softmax_attention_pooling,
    softmax_last_axis,
    layer_normalization_axes,
    masked_embedding_lstm,
    masked_embedding_gru_sequences,
    masked_embedding_bidirectional,
    simple_rnn_sequences,
    conv1d_regressor,
    custom_per_example_layer,
    reshape_to_image,
    attention_and_group_norm,
    prelu_permute_dot,
    separate_softmax_output,
    time_distributed_dense,
    masked_merge,
]


def _perturb_weights(net, x):
    """Move every weight and statistic off its initial value, so that a dropped or reset state shows."""
    for layer in net.layers:
        if layer.weights and not isinstance(layer, L.Normalization):
            layer.set_weights(
                [
                    w + 0.3 * RNG.standard_normal(w.shape).astype(w.dtype)
                    if w.dtype.kind == "f"
                    else w
                    for w in layer.get_weights()
                ]
            )
        if isinstance(layer, L.BatchNormalization):
            mean, variance = layer.moving_mean.numpy(), layer.moving_variance.numpy()
            layer.moving_mean.assign(mean + 0.5)
            layer.moving_variance.assign(np.abs(variance) + 0.7)


def _particle_probabilities(model, x):
    out = np.asarray(model.predict_particles(x, verbose=0))
    kind = type(model.likelihood).__name__
    if kind == "Categorical":
        return np.asarray(keras.ops.softmax(out))
    if kind == "Bernoulli":
        return np.asarray(keras.ops.sigmoid(out))
    return out


@pytest.mark.parametrize("build", CONVERTED, ids=lambda f: f.__name__)
def test_converted_model_predicts_as_the_keras_model(build, tmp_path):
    keras.utils.set_random_seed(0)
    net, x = build()
    _perturb_weights(net, x)
    expected = net.predict(x, verbose=0)
    likelihood = (
        None
        if net.layers[-1].get_config().get("activation") in ("softmax", "sigmoid")
        or isinstance(net.layers[-1], L.Softmax)
        else "normal"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = bk.bayesianize(net, num_particles=N, likelihood=likelihood, noise_std=0.0)
    got = _particle_probabilities(model, x)
    assert got.shape[:2] == (len(expected), N)
    np.testing.assert_allclose(got, np.repeat(expected[:, None], N, 1), atol=1e-5, rtol=0)
    path = str(tmp_path / "converted.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(_particle_probabilities(loaded, x), got, atol=1e-6, rtol=0)
    assert (
        not loaded.compiled
    )  # saved uncompiled, loaded uncompiled (not with a default Keras optimizer)


def _center_batch():
    inputs = keras.Input((6,))
    return keras.Model(inputs, L.Dense(1)(CenterBatch(name="center_batch")(L.Dense(8)(inputs))))


def _bn_rows():
    images = keras.Input((8, 8, 2))
    h = L.BatchNormalization(axis=1, name="bn_rows")(L.Conv2D(3, 3, padding="same")(images))
    return keras.Model(images, L.Dense(1)(L.Flatten()(h)))


def _late_mask():
    sequences = keras.Input((7, 4))
    return keras.Model(
        sequences, L.Dense(1)(L.LSTM(2)(L.Masking(name="late_mask")(L.Dense(3)(sequences))))
    )


def _mean():
    inputs = keras.Input((6,))
    h = keras.ops.mean(
        L.Dense(4)(inputs), axis=1, keepdims=True
    )  # a bare op on particle activations
    return keras.Model(inputs, L.Dense(1)(h))


def _with_state():
    sequences = keras.Input((7, 4))
    return keras.Model(
        sequences, L.Dense(1)(L.SimpleRNN(3, return_state=True, name="with_state")(sequences)[0])
    )


def _shared_layer():
    inputs = keras.Input((6,))
    shared = L.Dense(4, name="shared_dense")
    return keras.Model(
        inputs, L.Dense(1)(L.Add()([shared(inputs), shared(L.Rescaling(-1.0)(inputs))]))
    )


# (the name the error must contain, the model), built in the test, not at collection
REFUSED = [
    ("center_batch", _center_batch),
    ("bn_rows", _bn_rows),
    ("late_mask", _late_mask),
    ("mean", _mean),
    ("with_state", _with_state),
    ("shared_dense", _shared_layer),
]


@pytest.mark.parametrize("name,build", REFUSED, ids=[name for name, _ in REFUSED])
def test_what_cannot_be_converted_is_refused_naming_the_layer(name, build):
    with pytest.raises(ValueError, match=name):
        bk.bayesianize(build(), num_particles=N, likelihood="normal", noise_std=0.0)


def test_gallery_is_large_enough():
    assert len(CONVERTED) + len(REFUSED) >= 25
