"""Weights outside particle layers (layers bayesianize keeps without a twin, PerParticle-wrapped layers, Keras
layers before the particle axis) carry no prior: they are maximum-likelihood estimates, plus the penalty of any
Keras regularizer on their layer, counted once (docs/architecture.md, "Shared weights"). Checked against the
gradient written out by hand; the deterministic particle layers' shared weights keep their prior (counted once)."""

import keras
import numpy as np
import tensorflow as tf

import bayes_keras as bk

N, SIZE = 3, 200


def _model(regularizer=None):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    before = keras.layers.Dense(4, name="before")(
        inputs
    )  # a trainable Keras layer before the particle axis
    h = bk.layers.Dense(6, num_particles=N, activation="tanh", name="bayesian")(before)
    h = bk.layers.Dense(6, deterministic=True, name="shared_twin")(h)
    out = bk.layers.PerParticle(
        keras.layers.Dense(1, kernel_regularizer=regularizer, name="kept"), name="kept"
    )(h)
    model = bk.BayesianModel(
        inputs, out, likelihood=bk.likelihoods.Normal(scale=1.0), dataset_size=SIZE
    )
    model.compile(optimizer=bk.optimizers.IndependentParticles())
    return model


def _by_hand(model, x, y, regularizer_gradient):
    """d(-mean_n log_joint_n)/dw for the non-particle weights, from the outputs: Normal(scale 1) log likelihood
    scaled to the data set, the deterministic twin's N(0, 1) priors once, the regularizer's gradient once."""
    shared = [v for v in model.trainable_variables if not getattr(v, "is_particle_variable", False)]
    with tf.GradientTape() as tape:
        f = model(x, training=True)[..., 0]  # (batch, N)
        loglik = -0.5 * tf.reduce_sum(tf.square(y[:, None] - f), axis=0) * SIZE / len(x)  # (N,)
        twin = model.get_layer("shared_twin")
        prior = -0.5 * (tf.reduce_sum(tf.square(twin.kernel)) + tf.reduce_sum(tf.square(twin.bias)))
        objective = -tf.reduce_mean(loglik) - prior
    grads = tape.gradient(objective, shared)
    return {
        v.path: g.numpy() + regularizer_gradient.get(v.path, 0.0) for v, g in zip(shared, grads)
    }


def _library(model, x, y):
    grads, _ = model.bayesian_gradients(x, y)
    return {
        v.path: g.numpy()
        for v, g in zip(model.trainable_variables, grads)
        if g is not None and not getattr(v, "is_particle_variable", False)
    }


def test_weights_outside_particle_layers_are_maximum_likelihood_estimates():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 5)).astype("float32"), rng.standard_normal(16).astype("float32")
    model = _model()
    got, expected = _library(model, x, y), _by_hand(model, x, y, {})
    assert set(got) == {
        "before/kernel",
        "before/bias",
        "shared_twin/kernel",
        "shared_twin/bias",
        "kept/kept/kernel",
        "kept/kept/bias",
    }
    for path in got:
        np.testing.assert_allclose(got[path], expected[path], rtol=1e-4, atol=1e-5, err_msg=path)
    # no prior term moves with these weights: scaling one by 100 leaves the model's log prior unchanged
    before = [t.numpy() for t in model.log_prior()]
    model.get_layer("kept").layer.kernel.assign(100.0 * model.get_layer("kept").layer.kernel)
    np.testing.assert_array_equal(before[0], model.log_prior()[0].numpy())
    np.testing.assert_array_equal(before[1], model.log_prior()[1].numpy())


def test_a_keras_regularizer_on_a_kept_layer_is_its_penalty_counted_once():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 5)).astype("float32"), rng.standard_normal(16).astype("float32")
    model = _model(keras.regularizers.L2(0.5))
    kernel = model.get_layer("kept").layer.kernel.numpy()
    got, expected = (
        _library(model, x, y),
        _by_hand(model, x, y, {"kept/kept/kernel": 2 * 0.5 * kernel}),
    )
    np.testing.assert_allclose(
        got["kept/kept/kernel"], expected["kept/kept/kernel"], rtol=1e-4, atol=1e-5
    )
