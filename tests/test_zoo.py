"""Every optimizer trains every zoo model a few steps through fit (finite, decreasing loss). ResNet-20 and
text_rnn have their own files (test_resnet.py, test_text_rnn.py); here LeNet-5, the MLP and the GRU
classifier."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from optimizer_registry import configured

OPTIMIZERS = configured()  # every method with its defaults
MODELS = {
    "lenet5": lambda: bk.zoo.lenet5(num_particles=3),
    "mlp": lambda: bk.zoo.mlp(64, 10, (32,), num_particles=3, likelihood="categorical"),
    "gru_classifier": lambda: bk.zoo.gru_classifier(3, units=16),
}


@pytest.fixture(scope="module")
def digits():
    (x, y), _ = bk.datasets.load_digits()
    return x[:256], y[:256]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_optimizer_trains_every_zoo_model(model, optimizer, digits):
    x, y = digits
    if model == "mlp":
        x = x.reshape(len(x), -1)
    keras.utils.set_random_seed(0)
    net = MODELS[model]()
    net.compile(optimizer=OPTIMIZERS[optimizer]())
    losses = net.fit(x, y, epochs=4, batch_size=64, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("kind", ["vision", "text"])
def test_transformers_train_round_trip_and_match_their_keras_twins(kind, tmp_path):
    """The zoo transformers: the Keras twin converts exactly (so the two share one graph), the particle model
    trains (loss down) and round-trips .keras."""
    if kind == "vision":
        (x, y), _ = bk.datasets.load_digits()
        model = bk.zoo.vision_transformer(num_particles=3)
        twin = bk.zoo.keras_vision_transformer()
    else:
        (x, y), _ = bk.datasets.load_digit_tokens()
        model = bk.zoo.text_transformer(bk.datasets.DIGIT_TOKENS, 10, x.shape[1], num_particles=3)
        twin = bk.zoo.keras_text_transformer(bk.datasets.DIGIT_TOKENS, 10, x.shape[1])
    x, y = x[:128], y[:128]
    size = lambda variables: sum(int(np.prod(v.shape)) for v in variables)  # noqa: E731
    assert size(model.trainable_variables) == 3 * size(twin.trainable_variables)
    converted = bk.bayesianize(
        keras.Model(twin.input, keras.layers.Activation("softmax")(twin.output)),
        num_particles=3,
        noise_std=0.0,
    )
    np.testing.assert_allclose(
        tf.nn.softmax(converted(x[:8])).numpy(),
        np.broadcast_to(tf.nn.softmax(twin(x[:8])).numpy()[:, None], (8, 3, 10)),
        atol=1e-5,
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    history = model.fit(x, y, epochs=4, batch_size=64, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    model.save(tmp_path / "m.keras")
    np.testing.assert_allclose(
        keras.models.load_model(tmp_path / "m.keras").predict_particles(x[:8]),
        model.predict_particles(x[:8]),
        atol=1e-6,
    )
