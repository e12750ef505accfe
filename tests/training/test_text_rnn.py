"""zoo.text_rnn (Embedding -> GRU / LSTM -> Dense) and the digit-token data: per-particle equality with the
Keras twin, masking, particle independence, and every optimizer training it through fit."""

import keras
import numpy as np
import pytest

import bayes_keras as bk
from optimizer_registry import configured

N = 3


@pytest.fixture(scope="module")
def tokens():
    return bk.datasets.load_digit_tokens()


def test_digit_tokens_are_padded_row_shapes(tokens):
    (x, y), (x_test, y_test) = tokens
    assert x.dtype == np.int32 and x.shape[1] == 8 and len(x) + len(x_test) == 1797
    assert x.min() == 0 and x.max() <= bk.datasets.DIGIT_TOKENS
    # left padding only: once a sequence starts, no padding follows
    for row in np.concatenate([x, x_test]):
        inked = np.flatnonzero(row)
        assert np.all(row[inked[0] :] > 0)
    (x2, _), _ = bk.datasets.load_digits(image=False)
    first = x2[0].reshape(8, 8) * 16 >= 6 - 1e-6  # the same image, binarised as documented
    words = first.astype(int) @ (2 ** np.arange(7, -1, -1)) + 1
    inked = np.flatnonzero(words > 1)
    np.testing.assert_array_equal(x[0][x[0] > 0], words[inked[0] : inked[-1] + 1])


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_every_particle_equals_the_keras_twin(cell, tokens):
    (x, _), _ = tokens
    x = x[:16].copy()
    x[:4, :3] = 0  # more padding than the data has, to exercise the mask
    model = bk.zoo.text_rnn(
        bk.datasets.DIGIT_TOKENS, 4, embedding_dim=5, units=6, cell=cell, num_particles=N
    )
    out = model.predict_particles(x)
    twin = bk.zoo.keras_text_rnn(bk.datasets.DIGIT_TOKENS, 4, embedding_dim=5, units=6, cell=cell)
    for n in range(N):
        twin.set_weights([w.numpy()[n] for w in model.particle_variables])
        np.testing.assert_allclose(out[:, n], twin.predict(x, verbose=0), rtol=1e-5, atol=1e-5)


def test_particles_are_independent(tokens):
    (x, _), _ = tokens
    model = bk.zoo.text_rnn(bk.datasets.DIGIT_TOKENS, 3, embedding_dim=4, units=5, num_particles=N)
    before = model.predict_particles(x[:16])
    for variable in model.particle_variables:  # particle 1 of every layer moves
        value = variable.numpy()
        value[1] += 0.5
        variable.assign(value)
    after = model.predict_particles(x[:16])
    np.testing.assert_array_equal(after[:, [0, 2]], before[:, [0, 2]])
    assert not np.allclose(after[:, 1], before[:, 1])


OPTIMIZERS = configured(  # MatrixSVGD's default KFAC covers the embedding table too
    GaussianParticleFlow={"learning_rate": 1e-2},
    IndependentParticles={"learning_rate": 1e-2},
    SVGD={"learning_rate": 1e-2},
    MeanFieldVI={"learning_rate": 1e-2},
)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_trains_it(name, tokens):
    (x, y), _ = tokens
    keras.utils.set_random_seed(0)
    model = bk.zoo.text_rnn(
        bk.datasets.DIGIT_TOKENS, 10, embedding_dim=8, units=16, num_particles=N, dropout=0.1
    )
    model.compile(optimizer=OPTIMIZERS[name]())
    losses = model.fit(x[:256], y[:256], epochs=4, batch_size=64, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_lstm_regressor_and_hybrid(tokens):
    (x, y), _ = tokens
    keras.utils.set_random_seed(1)
    target = (x > 0).sum(1).astype(np.float32) + (y % 2)  # a number the sequence determines
    model = bk.zoo.text_rnn(
        bk.datasets.DIGIT_TOKENS,
        1,
        cell="lstm",
        embedding_dim=8,
        units=16,
        num_particles=N,
        deterministic_layers=("embedding",),
        likelihood="normal",
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    losses = model.fit(x[:256], target[:256], epochs=4, batch_size=64, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert not model.get_layer("embedding").trainable_weights[0].shape[0] == N  # shared table


def test_bad_arguments():
    with pytest.raises(ValueError, match="cell must be one of"):
        bk.zoo.text_rnn(10, 2, cell="transformer")
    with pytest.raises(ValueError, match="Unknown text_rnn layer names"):
        bk.zoo.text_rnn(10, 2, deterministic_layers=("gru",))
    with pytest.raises(ValueError, match="vocabulary_size must be a positive integer"):
        bk.zoo.text_rnn(0, 2)
