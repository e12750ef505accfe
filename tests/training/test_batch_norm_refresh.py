"""BatchNormalization statistics recomputed after training equal the population statistics of the final
weights (mean E[x], biased variance E[x^2] - E[x]^2 over every example and position of the refresh set),
computed independently in numpy from the layer's inputs (each particle's Conv2D outputs through a
per-particle keras.layers.Conv2D; a particle Dense layer's outputs from its weights in numpy), with every
other layer in inference mode; and a frozen BatchNormalization runs in inference mode under training=True.
The default refresh is one pass in which the BatchNormalization layers normalise with batch statistics
(later layers' inputs computed so in numpy, batch by batch); layerwise=True gives every layer the
statistics of the inputs it receives at inference.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk


def _model(momentum=0.9, particles=3, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 2))
    h = bk.layers.Conv2D(4, 3, padding="same", num_particles=particles)(inputs)
    h = bk.layers.BatchNormalization(momentum=momentum)(h)
    h = bk.layers.Activation("relu")(h)
    out = bk.layers.Dense(3)(bk.layers.Flatten()(h))
    return bk.BayesianModel(inputs, out, likelihood="categorical")


def _data(size=100, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((size, 6, 6, 2)) * 2 + 1).astype(np.float32)
    return x, rng.integers(0, 3, size)


def _conv_outputs(model, x):
    """Each particle's convolution outputs (N, batch, H, W, C), by plain Keras Conv2D layers."""
    conv = model.layers[1]
    outputs = []
    for p in range(conv.num_particles):
        ref = keras.layers.Conv2D(4, 3, padding="same")
        ref.build(x.shape)
        ref.kernel.assign(conv.kernel.numpy()[p])
        ref.bias.assign(conv.bias.numpy()[p])
        outputs.append(ref(x).numpy().astype(np.float64))
    return np.stack(outputs)


def _population(model, x, batch_size=None):
    """Per-particle mean and biased variance of the convolution outputs over all examples and positions
    (the population statistics: independent of the batch size the refresh reads them in)."""
    z = _conv_outputs(model, x)
    return z.mean(axis=(1, 2, 3)), z.var(axis=(1, 2, 3))


@pytest.mark.parametrize("momentum", [0.9, 0.99])
def test_refresh_gives_the_population_statistics(momentum):
    model = _model(momentum)
    x, y = _data()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, refresh_batch_norm=False)
    bn = model.layers[2]
    mean, variance = _population(model, x, 32)
    assert (
        np.max(np.abs(bn.moving_mean.numpy() - mean)) > 1e-2
    )  # the running averages lag the weights
    assert model.refresh_batch_norm(x, batch_size=32) == len(x)
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.moving_variance.numpy(), variance, rtol=1e-4)


def test_fit_refreshes_from_the_training_split_only():
    model = _model()
    x, y = _data()
    x[80:] += 50.0  # the validation rows, far off: statistics that read them would show it
    model.compile(optimizer=bk.optimizers.SVGD())
    model.fit(x, y, epochs=1, batch_size=16, validation_split=0.2, verbose=0)
    bn = model.layers[2]
    mean, variance = _population(model, x[:80], 16)
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.moving_variance.numpy(), variance, rtol=1e-4)
    before = [bn.moving_mean.numpy(), bn.moving_variance.numpy()]
    model.fit(
        x, y, epochs=1, batch_size=16, validation_split=0.2, verbose=0, refresh_batch_norm=False
    )
    assert not np.allclose(
        bn.moving_mean.numpy(), before[0]
    )  # running averages, as Keras keeps them


def test_refresh_from_a_dataset_and_a_subset():
    model = _model()
    x, y = _data(size=60)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(20)
    model.fit(dataset, epochs=1, verbose=0)
    bn = model.layers[2]
    mean, variance = _population(model, x, 20)
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.moving_variance.numpy(), variance, rtol=1e-4)
    # max_examples: evenly spaced examples of arrays
    assert model.refresh_batch_norm(x, batch_size=30, max_examples=30) == 30
    index = np.linspace(0, 59, 30).round().astype(int)
    mean, variance = _population(model, x[index], 30)
    np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.moving_variance.numpy(), variance, rtol=1e-4)


def test_bad_arguments_and_models_without_batch_norm():
    model = _model()
    x, y = _data(size=20)
    model.compile(optimizer=bk.optimizers.SVGD())
    with pytest.raises(ValueError, match="refresh_batch_norm must be True or False"):
        model.fit(x, y, epochs=1, verbose=0, refresh_batch_norm="yes")
    with pytest.raises(ValueError, match="max_examples must be a positive integer"):
        model.refresh_batch_norm(x, max_examples=0)
    with pytest.raises(ValueError, match="needs the training inputs x"):
        model.refresh_batch_norm(None)
    with pytest.raises(ValueError, match="no examples"):
        model.refresh_batch_norm(x[:0])
    inputs = keras.Input((3,))
    plain = bk.BayesianModel(
        inputs, bk.layers.Dense(2, num_particles=2)(inputs), likelihood="categorical"
    )
    assert plain.refresh_batch_norm(np.zeros((4, 3), np.float32)) == 0


def _dense_model(dropout=0.0, particles=3, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    h = bk.layers.Dense(4, num_particles=particles)(inputs)  # (batch, N, 4)
    if dropout:
        h = keras.layers.Dropout(dropout)(h)
    h = bk.layers.BatchNormalization(momentum=0.9)(h)
    h = bk.layers.Dense(6, activation="relu")(h)
    h = bk.layers.BatchNormalization(momentum=0.9)(h)
    return bk.BayesianModel(inputs, bk.layers.Dense(3)(h), likelihood="categorical")


def _dense_population(model, x):
    """numpy, float64: the population statistics of both BatchNormalization layers, the second computed
    with the first normalising by its population statistics (the network as it runs at inference)."""
    dense = [layer for layer in model.layers if isinstance(layer, bk.layers.Dense)]
    norms = [layer for layer in model.layers if isinstance(layer, bk.layers.BatchNormalization)]
    k1, b1 = (v.numpy().astype(np.float64) for v in (dense[0].kernel, dense[0].bias))
    h = np.einsum("bi,nio->bno", x.astype(np.float64), k1) + b1  # (batch, N, 4)
    mean1, var1 = h.mean(axis=0), h.var(axis=0)
    gamma, beta = (v.numpy().astype(np.float64) for v in (norms[0].gamma, norms[0].beta))
    h = (h - mean1) / np.sqrt(var1 + norms[0].epsilon) * gamma + beta
    k2, b2 = (v.numpy().astype(np.float64) for v in (dense[1].kernel, dense[1].bias))
    h = np.maximum(np.einsum("bni,nio->bno", h, k2) + b2, 0.0)
    return (mean1, var1), (h.mean(axis=0), h.var(axis=0))


def _dense_data(size=103, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((size, 5)) * 3 + 2).astype(np.float32), rng.integers(0, 3, size)


def test_refresh_at_batch_size_4_equals_numpy_population_statistics():
    model = _dense_model()
    x, y = _dense_data()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, refresh_batch_norm=False)
    norms = [layer for layer in model.layers if isinstance(layer, bk.layers.BatchNormalization)]
    assert model.refresh_batch_norm(x, batch_size=4, layerwise=True) == len(
        x
    )  # 25 batches of 4 and one of 3
    for layer, (mean, variance) in zip(norms, _dense_population(model, x)):
        scale = 1.0 + np.abs(mean)
        assert np.max(np.abs(layer.moving_mean.numpy() - mean) / scale) < 1e-5
        assert np.max(np.abs(layer.moving_variance.numpy() / variance - 1.0)) < 1e-5
    # the conv model: images, pooled over batch and positions
    model = _model()
    x, y = _data(size=50)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, refresh_batch_norm=False)
    assert model.refresh_batch_norm(x, batch_size=4) == len(x)
    mean, variance = _population(model, x)
    bn = model.layers[2]
    assert np.max(np.abs(bn.moving_mean.numpy() - mean) / (1.0 + np.abs(mean))) < 1e-5
    assert np.max(np.abs(bn.moving_variance.numpy() / variance - 1.0)) < 1e-5


def test_dropout_is_off_during_the_refresh():
    x, y = _dense_data()
    model = _dense_model(dropout=0.5)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, refresh_batch_norm=False)
    model.refresh_batch_norm(x, batch_size=16, layerwise=True)
    norms = [layer for layer in model.layers if isinstance(layer, bk.layers.BatchNormalization)]
    for layer, (mean, variance) in zip(
        norms, _dense_population(model, x)
    ):  # numpy: no dropout at all
        assert np.max(np.abs(layer.moving_mean.numpy() - mean) / (1.0 + np.abs(mean))) < 1e-5
        assert np.max(np.abs(layer.moving_variance.numpy() / variance - 1.0)) < 1e-5


def test_a_frozen_batch_normalization_runs_in_inference_mode():
    model = _model(momentum=0.5)
    x, y = _data(size=32)
    bn = model.layers[2]
    rng = np.random.default_rng(3)
    bn.moving_mean.assign(rng.standard_normal(bn.moving_mean.shape).astype(np.float32))
    bn.moving_variance.assign(rng.uniform(0.5, 2.0, bn.moving_variance.shape).astype(np.float32))
    stats = [bn.moving_mean.numpy(), bn.moving_variance.numpy()]
    bn.trainable = False
    z = np.moveaxis(_conv_outputs(model, x), 0, 3)  # (batch, H, W, N, C)
    expected = (z - stats[0]) / np.sqrt(stats[1] + bn.epsilon) * bn.gamma.numpy().astype(
        np.float64
    ) + bn.beta.numpy().astype(np.float64)
    conv_out = model.layers[1](x)
    for training in (True, False):
        np.testing.assert_allclose(
            bn(conv_out, training=training).numpy(), expected, rtol=1e-5, atol=1e-5
        )
    np.testing.assert_array_equal(bn.moving_mean.numpy(), stats[0])  # no moving-average update
    np.testing.assert_array_equal(bn.moving_variance.numpy(), stats[1])
    bn.trainable = True  # unfrozen: batch statistics under training=True, and the averages move
    np.testing.assert_allclose(
        bn(conv_out, training=True).numpy().mean(axis=(0, 1, 2)), bn.beta.numpy(), atol=1e-4
    )
    assert not np.allclose(bn.moving_mean.numpy(), stats[0])
    # frozen layers keep their statistics through fit and its refresh (as Keras' BatchNormalization)
    bn.trainable = False
    bn.moving_mean.assign(stats[0])
    bn.moving_variance.assign(stats[1])
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    np.testing.assert_array_equal(bn.moving_mean.numpy(), stats[0])
    np.testing.assert_array_equal(bn.moving_variance.numpy(), stats[1])


def _one_pass_population(model, x, batch_size):
    """numpy, float64: the population statistics of both BatchNormalization layers of `_dense_model` when the
    first normalises each batch of `batch_size` examples (in order, the last one short) with that batch's
    mean and biased variance, as the one-pass refresh runs it."""
    dense = [layer for layer in model.layers if isinstance(layer, bk.layers.Dense)]
    norms = [layer for layer in model.layers if isinstance(layer, bk.layers.BatchNormalization)]
    k1, b1, k2, b2 = (
        v.numpy().astype(np.float64)
        for v in (dense[0].kernel, dense[0].bias, dense[1].kernel, dense[1].bias)
    )
    gamma, beta = (v.numpy().astype(np.float64) for v in (norms[0].gamma, norms[0].beta))
    firsts, seconds = [], []
    for start in range(0, len(x), batch_size):
        h = (
            np.einsum("bi,nio->bno", x[start : start + batch_size].astype(np.float64), k1) + b1
        )  # (batch, N, 4)
        firsts.append(h)
        h = (h - h.mean(axis=0)) / np.sqrt(h.var(axis=0) + norms[0].epsilon) * gamma + beta
        seconds.append(np.maximum(np.einsum("bni,nio->bno", h, k2) + b2, 0.0))
    return [
        (np.concatenate(v).mean(axis=0), np.concatenate(v).var(axis=0)) for v in (firsts, seconds)
    ]


def _close(layer, mean, variance, tolerance=1e-5):
    assert np.max(np.abs(layer.moving_mean.numpy() - mean) / (1.0 + np.abs(mean))) < tolerance
    assert np.max(np.abs(layer.moving_variance.numpy() / variance - 1.0)) < tolerance


def test_one_pass_default_at_batch_size_4_equals_numpy():
    x, y = _dense_data()
    model = _dense_model(
        dropout=0.5
    )  # Dropout(0.5) before the first BatchNormalization: off in the pass
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, refresh_batch_norm=False)
    norms = [layer for layer in model.layers if isinstance(layer, bk.layers.BatchNormalization)]
    assert model.refresh_batch_norm(x, batch_size=4) == len(x)
    (mean1, var1), (mean2, var2) = _one_pass_population(model, x, 4)
    _close(norms[0], mean1, var1)  # the first layer's inputs: the population statistics, exactly
    _close(
        norms[1], mean2, var2
    )  # the second's: its inputs with the first normalising by batch statistics
    (exact1, _), (exact2, exact_var2) = _dense_population(model, x)
    np.testing.assert_allclose(
        mean1, exact1, rtol=1e-12
    )  # (the references agree on the first layer only)
    assert np.max(np.abs(var2 / exact_var2 - 1.0)) > 1e-3
    # fit's refresh is the one pass at fit's batch size
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    (mean1, var1), (mean2, var2) = _one_pass_population(model, x, 4)
    _close(norms[0], mean1, var1)
    _close(norms[1], mean2, var2)


def test_the_pass_leaves_the_moving_statistics_alone():
    """Inside batch_statistics_pass a layer normalises as in training (batch statistics; images: the unfused
    formula against training's fused op) and its moving statistics do not move."""
    for model, x in ((_dense_model(), _dense_data()[0]), (_model(momentum=0.5), _data(size=20)[0])):
        norms = [layer for layer in model.layers if isinstance(layer, bk.layers.BatchNormalization)]
        before = [(layer.moving_mean.numpy(), layer.moving_variance.numpy()) for layer in norms]
        with bk.layers.batch_normalization.batch_statistics_pass(norms):
            inside = model(x, training=False).numpy()
        for layer, (mean, variance) in zip(norms, before):
            np.testing.assert_array_equal(layer.moving_mean.numpy(), mean)
            np.testing.assert_array_equal(layer.moving_variance.numpy(), variance)
        np.testing.assert_allclose(inside, model(x, training=True).numpy(), rtol=1e-4, atol=1e-5)
        assert not np.allclose(
            norms[0].moving_mean.numpy(), before[0][0]
        )  # training=True does move them


def _counting_dataset(x, batch_size, counts):
    def generate():
        counts["passes"] += 1
        for start in range(0, len(x), batch_size):
            counts["batches"] += 1
            yield x[start : start + batch_size]

    return tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec((None, x.shape[1]), x.dtype)
    )


def test_the_default_reads_the_examples_once():
    x, y = _dense_data()
    model = _dense_model()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, refresh_batch_norm=False)
    counts = {"passes": 0, "batches": 0}
    assert model.refresh_batch_norm(_counting_dataset(x, 8, counts)) == len(x)
    assert counts == {"passes": 1, "batches": 13}  # one pass: 12 batches of 8 and one of 7
    (mean1, var1), (mean2, var2) = _one_pass_population(model, x, 8)
    norms = [layer for layer in model.layers if isinstance(layer, bk.layers.BatchNormalization)]
    _close(norms[0], mean1, var1)
    _close(norms[1], mean2, var2)
    counts = {"passes": 0, "batches": 0}
    model.refresh_batch_norm(_counting_dataset(x, 8, counts), layerwise=True)
    assert counts["passes"] >= 2  # one per layer (and the first batch read for the shapes)
    for layer, (mean, variance) in zip(norms, _dense_population(model, x)):
        _close(layer, mean, variance)


def test_layerwise_must_be_a_bool():
    model = _dense_model()
    x, _ = _dense_data(size=8)
    for value in ("yes", 1, None):
        with pytest.raises(ValueError, match=r"layerwise must be True or False; got"):
            model.refresh_batch_norm(x, layerwise=value)
