"""BatchNormalization statistics recomputed after training equal the population statistics of the final
weights, computed independently in numpy from the layer's inputs (each particle's Conv2D outputs through a
per-particle keras.layers.Conv2D)."""

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


def _population(model, x, batch_size):
    """Example-weighted means of the batches' per-particle means and biased variances."""
    z = _conv_outputs(model, x)
    means, variances, counts = [], [], []
    for start in range(0, len(x), batch_size):
        chunk = z[:, start:start + batch_size]
        means.append(chunk.mean(axis=(1, 2, 3)))
        variances.append(chunk.var(axis=(1, 2, 3)))
        counts.append(chunk.shape[1])
    w = np.array(counts, np.float64)[:, None, None] / sum(counts)
    return (w * np.stack(means)).sum(0), (w * np.stack(variances)).sum(0)


@pytest.mark.parametrize("momentum", [0.9, 0.99])
def test_refresh_gives_the_population_statistics(momentum):
    model = _model(momentum)
    x, y = _data()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, refresh_batch_norm=False)
    bn = model.layers[2]
    mean, variance = _population(model, x, 32)
    assert np.max(np.abs(bn.moving_mean.numpy() - mean)) > 1e-2  # the running averages lag the weights
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
    model.fit(x, y, epochs=1, batch_size=16, validation_split=0.2, verbose=0, refresh_batch_norm=False)
    assert not np.allclose(bn.moving_mean.numpy(), before[0])  # running averages, as Keras keeps them


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
    plain = bk.BayesianModel(inputs, bk.layers.Dense(2, num_particles=2)(inputs), likelihood="categorical")
    assert plain.refresh_batch_norm(np.zeros((4, 3), np.float32)) == 0
