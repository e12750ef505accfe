"""bayesianize: a user's Keras model becomes a BayesianModel with the same architecture per particle."""

import keras
import numpy as np
import pytest

import bayes_keras as bk


def _user_cnn():
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(6, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(12, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="user_cnn",
    )


def test_bayesianized_cnn_has_the_same_parameters_and_starts_at_the_original():
    (x, y), (xt, yt) = bk.datasets.load_digits()
    keras.utils.set_random_seed(0)
    cnn = _user_cnn()
    cnn.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    cnn.fit(x, y, epochs=20, batch_size=64, verbose=0)
    original_accuracy = cnn.evaluate(xt, yt, verbose=0)[1]
    # defaults: the particles spread by 0.1 of each weight tensor's rms keep the network's accuracy and disagree
    default = bk.bayesianize(cnn, num_particles=10, seed=0)
    assert bk.metrics.accuracy(default.predict(xt, verbose=0), yt) >= original_accuracy - 0.005
    assert default.uncertainty(xt)["mutual_information"].mean() > 1e-3
    model = bk.bayesianize(cnn, num_particles=4, noise_std=1e-3, seed=0)
    assert isinstance(
        model.likelihood, bk.likelihoods.Categorical
    )  # from the softmax, which is removed
    per_particle = sum(int(np.prod(v.shape[1:])) for v in model.particle_variables)
    assert per_particle == cnn.count_params()
    # every particle at the original's weights (up to 1e-3 noise): each particle's softmax is the original's
    probs = keras.ops.softmax(model.predict_particles(xt)).numpy()
    np.testing.assert_allclose(
        probs, np.repeat(cnn.predict(xt, verbose=0)[:, None], 4, 1), atol=0.02
    )
    assert bk.metrics.accuracy(model.predict(xt, verbose=0), yt) >= original_accuracy - 0.01
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-3, structure="layer"))
    history = model.fit(x, y, epochs=3, batch_size=64, verbose=0)
    assert (
        np.all(np.isfinite(history.history["loss"]))
        and history.history["loss"][-1] < history.history["loss"][0]
    )


def test_functional_model_with_deterministic_layers():
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    h = keras.layers.Dropout(0.1)(h)
    out = keras.layers.Dense(1, name="head")(h)
    net = keras.Model(inputs, out)
    model = bk.bayesianize(net, num_particles=3, likelihood="normal", deterministic=["head"])
    assert [layer.name for layer in model.particle_layers] == ["hidden", "head"]
    assert model.get_layer("head").deterministic and not model.get_layer("hidden").deterministic
    np.testing.assert_allclose(
        model.get_layer("head").kernel.numpy(), net.get_layer("head").kernel.numpy()
    )


def test_unsupported_layers_are_named():
    net = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8),
            keras.layers.Lambda(lambda x: x - keras.ops.mean(x, axis=0), name="batch_centering"),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )
    with pytest.raises(ValueError, match="batch_centering"):
        bk.bayesianize(net)
    with pytest.raises(ValueError, match="pass likelihood="):
        bk.bayesianize(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]))
    with pytest.raises(ValueError, match="defined inputs"):
        bk.bayesianize(keras.Sequential([keras.layers.Dense(1)]), likelihood="normal")


@pytest.mark.parametrize("recurrent", [keras.layers.SimpleRNN, keras.layers.LSTM, keras.layers.GRU])
def test_recurrent_models_start_at_the_original(recurrent):
    keras.utils.set_random_seed(1)
    net = keras.Sequential(
        [keras.Input((8, 8)), recurrent(12), keras.layers.Dense(10, activation="softmax")]
    )
    x = np.random.default_rng(0).standard_normal((5, 8, 8)).astype(np.float32)
    model = bk.bayesianize(net, num_particles=2, noise_std=0.0)
    probs = keras.ops.softmax(model.predict_particles(x)).numpy()
    np.testing.assert_allclose(
        probs, np.repeat(net.predict(x, verbose=0)[:, None], 2, 1), atol=1e-5
    )


def test_batch_normalization_converts_with_its_statistics():
    keras.utils.set_random_seed(2)
    net = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    x = np.random.default_rng(0).standard_normal((32, 8, 8, 1)).astype(np.float32)
    net.compile("adam", "sparse_categorical_crossentropy")
    net.fit(x, np.arange(32) % 10, epochs=2, verbose=0)  # moves the moving averages away from 0 / 1
    model = bk.bayesianize(net, num_particles=2, noise_std=0.0)
    probs = keras.ops.softmax(model.predict_particles(x)).numpy()
    np.testing.assert_allclose(
        probs, np.repeat(net.predict(x, verbose=0)[:, None], 2, 1), atol=1e-5
    )


def test_batch_normalization_momentum_of_the_conversion():
    """Converted BatchNormalization layers average their moving statistics over ~10 steps by default (0.9), so
    inference mode follows particles that keep moving; None keeps the Keras layer's own; bad values are refused."""
    inputs = keras.Input((6, 6, 1))
    h = keras.layers.Conv2D(4, 3, use_bias=False)(inputs)
    h = keras.layers.BatchNormalization(momentum=0.99)(h)
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Flatten()(h))
    net = keras.Model(inputs, outputs)

    def momenta(model):
        return [
            layer.momentum
            for layer in model.layers
            if isinstance(layer, bk.layers.BatchNormalization)
        ]

    assert momenta(bk.bayesianize(net, num_particles=2)) == [0.9]
    assert momenta(bk.bayesianize(net, num_particles=2, batch_norm_momentum=None)) == [0.99]
    for bad in (1.0, -0.1, "fast", True):
        with pytest.raises(ValueError, match="batch_norm_momentum must be a number in"):
            bk.bayesianize(net, num_particles=2, batch_norm_momentum=bad)


def test_kept_random_layers_become_twins_that_draw_per_particle_with_keras_noise_shapes():
    """SpatialDropout1D/2D, Dropout with a noise shape and AlphaDropout become bayes_keras twins (which draw under
    tf.distribute what one device draws): each particle gets its own mask, shared where Keras shares it."""
    n, rate = 5, 0.5
    inputs = keras.Input((6, 6, 1))
    h = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    h = keras.layers.SpatialDropout2D(rate, name="spatial2d")(h)
    h = keras.layers.Dropout(rate, noise_shape=(None, 1, 4, 4), name="rows")(h)
    h = keras.layers.Reshape((16, 4))(h)
    h = keras.layers.SpatialDropout1D(rate, name="spatial1d")(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.AlphaDropout(0.2, name="alpha")(h)
    model = bk.bayesianize(
        keras.Model(inputs, keras.layers.Dense(3)(h)), num_particles=n, likelihood="categorical"
    )
    kinds = {
        name: (type(model.get_layer(name)), model.get_layer(name).noise_shape)
        for name in ("spatial2d", "rows", "spatial1d", "alpha")
    }
    assert kinds == {
        "spatial2d": (bk.layers.Dropout, (None, 1, 1, None, None)),
        "rows": (bk.layers.Dropout, (None, 1, 4, None, 4)),
        "spatial1d": (bk.layers.Dropout, (None, None, 1, None)),
        "alpha": (bk.layers.AlphaDropout, None),
    }
    keras.utils.set_random_seed(0)
    kept = (
        model.get_layer("spatial2d")(np.ones((200, 4, 4, n, 4), "float32"), training=True).numpy()
        > 0
    )
    assert np.all(kept == kept[:, :1, :1])  # one draw per example, particle and channel
    assert abs(kept.mean() - (1 - rate)) < 0.03
    per_particle = kept[:, 0, 0]  # (examples, particles, channels)
    assert (
        abs(np.mean(per_particle[:, 0] == per_particle[:, 1]) - 0.5) < 0.05
    )  # independent across particles
    # the alpha twin is Keras' AlphaDropout on one device: the same output from the same generator state
    x = np.random.default_rng(0).normal(size=(8, n, 48)).astype("float32")
    twin, original = model.get_layer("alpha"), keras.layers.AlphaDropout(0.2)
    original.seed_generator.state.assign(twin.seed_generator.state.value)
    np.testing.assert_array_equal(twin(x, training=True), original(x, training=True))
