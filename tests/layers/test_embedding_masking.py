"""Particle Embedding and masking through the particle recurrent layers, against Keras per particle."""

import keras
import numpy as np
import pytest

import bayes_keras as bk

VOCAB, DIM, UNITS, N = 12, 5, 4, 3


def _tokens(seed=0, padding="post"):
    rng = np.random.default_rng(seed)
    lengths = [7, 3, 5, 1]
    x = np.zeros((4, 7), np.int32)
    for i, length in enumerate(lengths):
        tokens = rng.integers(1, VOCAB, length)
        if padding == "post":
            x[i, :length] = tokens
        else:
            x[i, 7 - length :] = tokens
    return x


@pytest.mark.parametrize("rnn", ["SimpleRNN", "LSTM", "GRU"])
@pytest.mark.parametrize("return_sequences", [False, True])
def test_masked_recurrence_equals_keras_per_particle(rnn, return_sequences):
    tokens = keras.Input((None,), dtype="int32")
    h = bk.layers.Embedding(VOCAB, DIM, mask_zero=True, num_particles=N)(tokens)
    out = getattr(bk.layers, rnn)(UNITS, return_sequences=return_sequences)(h)
    model = keras.Model(tokens, out)
    embedding, recurrent = model.layers[1], model.layers[2]
    x = _tokens()
    y = model(x).numpy()
    for p in range(N):
        ref_in = keras.Input((None,), dtype="int32")
        ref_h = keras.layers.Embedding(VOCAB, DIM, mask_zero=True)(ref_in)
        ref_out = getattr(keras.layers, rnn)(UNITS, return_sequences=return_sequences)(ref_h)
        ref = keras.Model(ref_in, ref_out)
        ref.layers[1].set_weights([embedding.embeddings.numpy()[p]])
        ref.layers[2].set_weights([w.numpy()[p] for w in recurrent.weights])
        np.testing.assert_allclose(y[:, p], ref(x).numpy(), rtol=1e-5, atol=1e-6)


def test_left_and_right_padding_agree_under_the_mask():
    tokens = keras.Input((None,), dtype="int32")
    h = bk.layers.Embedding(VOCAB, DIM, mask_zero=True, num_particles=N)(tokens)
    out = bk.layers.Dense(2)(bk.layers.LSTM(UNITS)(h))
    model = bk.BayesianModel(tokens, out, likelihood="categorical")
    np.testing.assert_allclose(
        model.predict_particles(_tokens(padding="post")),
        model.predict_particles(_tokens(padding="pre")),
        rtol=1e-5,
        atol=1e-6,
    )


def test_masked_average_pooling_and_training():
    tokens = keras.Input((None,), dtype="int32")
    h = bk.layers.Embedding(VOCAB, DIM, mask_zero=True, num_particles=N)(tokens)
    h = bk.layers.GRU(UNITS, return_sequences=True)(h)
    out = bk.layers.Dense(2)(bk.layers.GlobalAveragePooling1D()(h))
    model = bk.BayesianModel(tokens, out, likelihood="categorical")
    x = np.concatenate([_tokens(s) for s in range(8)])
    y = (x[:, 0] % 2).astype(np.int32)
    model.compile(optimizer=bk.optimizers.SVGD(1e-2))
    losses = model.fit(x, y, epochs=5, batch_size=8, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    # padding with more zeros changes nothing
    wider = np.concatenate([x, np.zeros((len(x), 3), np.int32)], 1)
    np.testing.assert_allclose(
        model.predict_particles(wider), model.predict_particles(x), rtol=1e-5, atol=1e-6
    )


def test_embedding_particles_are_independent_and_errors():
    layer = bk.layers.Embedding(VOCAB, DIM, num_particles=N)
    x = _tokens()
    before = layer(x).numpy()
    assert before.shape == (4, N, 7, DIM)
    table = layer.embeddings.numpy()
    table[1] += 1.0
    layer.embeddings.assign(table)
    after = layer(x).numpy()
    np.testing.assert_array_equal(after[:, [0, 2]], before[:, [0, 2]])
    with pytest.raises(ValueError, match="num_particles"):
        bk.layers.Embedding(VOCAB, DIM)
    shared = bk.layers.Embedding(VOCAB, DIM, deterministic=True, num_particles=N)
    assert shared(x).shape == (4, N, 7, DIM) and shared.embeddings.shape == (VOCAB, DIM)
