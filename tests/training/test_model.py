"""BayesianModel through the Keras workflow, checked against closed forms."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

import bayes_keras as bk
from targets import (
    class_data,
    exact_linear_posterior,
    linear_data,
    linear_model,
    linear_particles,
    tiny_classifier,
)

tfd = tfp.distributions


def test_gpf_through_fit_recovers_conjugate_posterior():
    """Gaussian posterior + D + 1 particles: GPF's fixed point is the exact posterior (Theorem 1),
    so this checks the whole Keras path (likelihood scaling, prior, gradient hand-off)."""
    noise = 0.5
    x, y = linear_data(noise=noise)
    mean, cov = exact_linear_posterior(x, y, noise)
    model = linear_model(3, 5, bk.likelihoods.Normal(scale=noise))
    # eta * lambda_max(posterior precision ~ 240) ~ 0.5 < 2: stable; 4000 steps -> t = 8.
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(2e-3, step_rule="sgd"))
    ds = tf.data.Dataset.from_tensors((x, y)).repeat(4000)  # full batch, 4000 steps
    model.fit(ds, epochs=1, dataset_size=len(x), verbose=0)
    p = linear_particles(model)
    z = p - p.mean(0)
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(p.mean(0) - mean) < 1e-3 * sd)
    np.testing.assert_allclose(np.sqrt(np.diag(z.T @ z / len(p))), sd, rtol=1e-3)
    np.testing.assert_allclose(z.T @ z / len(p), cov, atol=1e-3 * sd.max() ** 2)


def test_minibatch_gradient_is_scaled_log_joint():
    """grad of the per-particle log joint = (n / B) X^T (y - X w) / s^2 - w (prior N(0, 1))."""
    noise = 0.7
    x, y = linear_data(n=40, noise=noise)
    model = linear_model(3, 4, bk.likelihoods.Normal(scale=noise))
    model.compile(optimizer=bk.optimizers.IndependentParticles(), dataset_size=400)
    xb, yb = x[:10], y[:10]
    with tf.GradientTape() as tape:
        log_joint, _ = model._log_joint(yb, model(xb), None)
    gk, gb = tape.gradient(log_joint, model.particle_variables)
    k, b = [v.numpy() for v in model.particle_variables]
    for n in range(4):
        resid = yb - (xb @ k[n, :, 0] + b[n, 0])
        np.testing.assert_allclose(
            gk.numpy()[n, :, 0], 400 / 10 * xb.T @ resid / noise**2 - k[n, :, 0], rtol=1e-4
        )
        np.testing.assert_allclose(
            gb.numpy()[n, 0], 400 / 10 * resid.sum() / noise**2 - b[n, 0], rtol=1e-4
        )


def test_predictive_and_uncertainty_decomposition():
    x, y = class_data()
    model = tiny_classifier()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2), metrics=["accuracy"])
    hist = model.fit(x, y, epochs=3, batch_size=16, verbose=0)
    assert {"loss", "nll", "accuracy", "free_energy"} <= set(hist.history)
    probs = model.predict(x, verbose=0)
    per = tf.nn.softmax(model.predict_particles(x)).numpy()
    np.testing.assert_allclose(probs, per.mean(1), atol=1e-6)
    dist = model.predictive(x)
    assert isinstance(dist, tfd.Categorical) and dist.batch_shape == (64,)
    np.testing.assert_allclose(dist.probs_parameter().numpy(), probs, atol=1e-6)
    u = model.uncertainty(x)
    np.testing.assert_allclose(
        u["total_entropy"], u["expected_entropy"] + u["mutual_information"], atol=1e-5
    )
    np.testing.assert_allclose(u["total_entropy"], -np.sum(probs * np.log(probs), 1), atol=1e-4)
    assert np.all(u["mutual_information"] >= 0)
    # evaluate's nll is the predictive NLL, not a per-particle average
    ev = model.evaluate(x, y, verbose=0, return_dict=True)
    assert abs(ev["nll"] - bk.metrics.nll(probs, y)) < 1e-4


def test_regression_predictive_variance_decomposition():
    x, y = linear_data()
    model = linear_model(3, 6, bk.likelihoods.Normal(scale=0.5))
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=2, batch_size=20, verbose=0)
    out = model.predict_particles(x)[..., 0]
    summary = model.predict(x, verbose=0)
    np.testing.assert_allclose(summary["mean"][:, 0], out.mean(1), atol=1e-5)
    np.testing.assert_allclose(summary["std"][:, 0] ** 2, 0.25 + out.var(1), rtol=1e-4)
    dist = model.predictive(x)
    np.testing.assert_allclose(dist.mean().numpy()[:, 0], out.mean(1), atol=1e-5)
    np.testing.assert_allclose(dist.variance().numpy()[:, 0], 0.25 + out.var(1), rtol=1e-4)


def test_learned_noise_scale_approaches_truth():
    x, y = linear_data(n=400, noise=0.3, seed=3)
    model = linear_model(3, 4, bk.likelihoods.Normal(scale="learned", standardize=False))
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2, shared_learning_rate=3e-2))
    # 480 steps: the default dimension-wise Adam's bias-corrected first steps are about 1e-2 per weight (RMSProp's
    # uncorrected ones were larger, and 240 steps were enough); at 240 steps the fit is not there yet (1.53)
    model.fit(x, y, epochs=120, batch_size=100, verbose=0)
    sigma = float(model.likelihood.noise_scale().numpy()[0])
    assert abs(sigma - 0.3) < 0.05, sigma


def test_standardised_targets_learned_noise_in_target_units():
    """The default Normal standardises the targets (here shifted by 500 and scaled by 40): the noise it
    learns, and its predictive, come back in the targets' units."""
    x, y = linear_data(n=400, noise=0.3, seed=3)
    model = linear_model(3, 4, "normal")
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2, shared_learning_rate=3e-2))
    model.fit(x, 500.0 + 40.0 * y, epochs=120, batch_size=100, verbose=0)
    sigma = float(model.likelihood.noise_scale().numpy()[0])
    assert abs(sigma - 40.0 * 0.3) < 40.0 * 0.05, sigma
    mean = model.predict(x, verbose=0)["mean"][:, 0]
    assert np.sqrt(np.mean((mean - (500.0 + 40.0 * y)) ** 2)) < 40.0 * 0.35  # residual ~ the noise
    # adapted once, from the training targets: a second fit keeps the standardisation
    model.fit(x[:50], y[:50], epochs=1, verbose=0)
    assert model.likelihood.loc_scale(np.zeros((1, 4, 1), np.float32))[
        0
    ].numpy().mean() == pytest.approx(np.mean(500.0 + 40.0 * y), rel=1e-5)


def test_bernoulli_likelihood_trains():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 2)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
    inputs = keras.Input((2,))
    out = bk.layers.Dense(1, num_particles=5)(inputs)
    model = bk.BayesianModel(inputs, out, likelihood="bernoulli")
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(5e-2), metrics=["binary_accuracy"])
    model.fit(x, y, epochs=20, batch_size=50, verbose=0)
    p = model.predict(x, verbose=0)
    assert p.shape == (200,)
    assert np.mean((p > 0.5) == y) > 0.95


def test_deterministic_layers_are_shared_and_trained():
    x, y = class_data()
    inputs = keras.Input((5,))
    h = bk.layers.Dense(8, activation="tanh", num_particles=3, deterministic=True)(inputs)
    out = bk.layers.Dense(3)(h)
    model = bk.BayesianModel(inputs, out, likelihood="categorical")
    assert model.num_particles == 3 and len(model.particle_variables) == 2
    shared_before = model.layers[1].kernel.numpy().copy()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    assert model.layers[1].kernel.shape == (5, 8)
    assert not np.allclose(model.layers[1].kernel.numpy(), shared_before)


def test_nonfinite_gradient_never_reaches_particles():
    x, y = class_data()
    model = tiny_classifier()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    before = [v.numpy().copy() for v in model.trainable_variables]
    x_bad = x.copy()
    x_bad[3, 2] = np.nan
    assert model.skipped_steps == 0
    with pytest.warns(RuntimeWarning, match="skipped"):
        model.fit(x_bad, y, epochs=1, batch_size=64, verbose=0)
    assert model.skipped_steps == 1  # the one batch with the NaN
    for b, v in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(b, v.numpy())
    # and training goes on normally afterwards
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    assert all(np.all(np.isfinite(v.numpy())) for v in model.trainable_variables)


# -- bad input -------------------------------------------------------------------------------


def test_num_particles_must_be_positive():
    with pytest.raises(ValueError, match="num_particles"):
        bk.layers.Dense(3, num_particles=0)
    with pytest.raises(ValueError, match="num_particles"):
        tiny_classifier(n_particles=-1)


def test_gpf_rejects_one_particle_at_compile():
    model = tiny_classifier(n_particles=1)
    with pytest.raises(ValueError, match="at least 2 particles"):
        model.compile(optimizer=bk.optimizers.GaussianParticleFlow())


def test_labels_out_of_range_are_reported():
    x, y = class_data()
    model = tiny_classifier()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    # arrays: refused at the door; a tf.data pipeline's labels: in the graph, at the batch that holds them
    with pytest.raises(
        ValueError, match=r"y must be class labels in \[0, 3\).*got labels from 3 to 5"
    ):
        model.fit(x, y + 3, epochs=1, verbose=0)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"labels must be in \[0, num_classes\)"
    ):
        model.fit(tf.data.Dataset.from_tensor_slices((x, y + 3)).batch(16), epochs=1, verbose=0)
    bad = y.copy()
    bad[1] = 12  # the message names the offending label, not the batch's first few
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"num_classes =\] \[3\].*from\] \[0\] \[to\] \[12\]"
    ):
        model.fit(tf.data.Dataset.from_tensor_slices((x, bad)).batch(64), epochs=1, verbose=0)


def test_fractional_labels_are_refused():
    x, y = class_data()
    model = tiny_classifier()
    model.compile(optimizer=bk.optimizers.IndependentParticles())
    with pytest.raises(
        ValueError, match=r"y must be class indices \(whole numbers\); got values such as \d\.3"
    ):
        model.fit(x, y + 0.3, epochs=1, verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be whole numbers"):
        model.fit(tf.data.Dataset.from_tensor_slices((x, y + 0.3)).batch(16), epochs=1, verbose=0)
    model.fit(x, y.astype(np.float32), epochs=1, verbose=0)  # whole-number floats are class indices


def test_fit_before_compile_and_negative_schedules_are_refused():
    x, y = class_data()
    with pytest.raises(ValueError, match=r"call compile\(\) before fit"):
        tiny_classifier().fit(x, y, epochs=1, verbose=0)
    for optimizer in (
        bk.optimizers.IndependentParticles,
        bk.optimizers.GaussianParticleFlow,
        bk.optimizers.MGVBP,
    ):
        with pytest.raises(ValueError, match="finite non-negative rate"):
            optimizer(keras.optimizers.schedules.CosineDecay(-1e-3, 100))
    bk.optimizers.GaussianParticleFlow(keras.optimizers.schedules.CosineDecay(1e-3, 100))


def test_labels_of_wrong_shape_are_reported():
    x, y = class_data()
    model = tiny_classifier()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    with pytest.raises(ValueError, match=r"labels of shape \(batch,\) or \(batch, 1\)"):
        model.fit(x, np.eye(3)[y].astype(np.float32)[:, :, None], epochs=1, verbose=0)


def test_likelihood_must_fit_output_shape():
    inputs = keras.Input((5,))
    out = bk.layers.Dense(3, num_particles=2)(inputs)
    with pytest.raises(ValueError, match="Bernoulli likelihood expects model outputs"):
        bk.BayesianModel(inputs, out, likelihood="bernoulli")
    model = bk.BayesianModel(inputs, out)
    with pytest.raises(ValueError, match="Bernoulli likelihood expects model outputs"):
        model.compile(optimizer=bk.optimizers.IndependentParticles(), likelihood="bernoulli")
    one = bk.layers.Dense(1, num_particles=2)(inputs)
    with pytest.raises(ValueError, match="num_classes >= 2"):
        bk.BayesianModel(inputs, one, likelihood="categorical")


def test_unknown_dataset_size_is_reported():
    x, y = class_data()
    model = tiny_classifier()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    with pytest.raises(
        ValueError, match="infinite tf.data.Dataset.*steps_per_epoch"
    ):  # it would never end
        model.fit(ds, epochs=1, verbose=0)
    with pytest.warns(UserWarning, match="upper bound"):  # read steps_per_epoch batches at a time
        model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0)
    assert model.dataset_size == 32
    # a finite dataset is counted
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)
    assert model.dataset_size == 64


def test_loss_instead_of_likelihood():
    model = tiny_classifier()
    model.compile(
        optimizer=bk.optimizers.IndependentParticles(), loss="sparse_categorical_crossentropy"
    )
    assert isinstance(model.likelihood, bk.likelihoods.Categorical)
    with pytest.raises(ValueError, match="likelihood, not a loss"):
        model.compile(optimizer=bk.optimizers.IndependentParticles(), loss="hinge")


def test_missing_particle_axis_is_explained():
    inputs = keras.Input((5,))
    with pytest.raises(ValueError, match="pass num_particles=N"):
        bk.layers.Dense(3)(inputs)
    img = keras.Input((8, 8, 1))
    with pytest.raises(ValueError, match="pass num_particles=N"):
        bk.layers.Conv2D(3, 3)(img)


def test_initialize_particles_around_map_weights():
    model = bk.zoo.mlp(5, 3, (8,), num_particles=4, likelihood="categorical")
    center = bk.zoo.keras_mlp(5, 3, (8,))
    model.initialize_particles(center, noise_std=0.01, seed=0)
    for v, c in zip(model.particle_variables, center.get_weights()):
        # the jitter's sd is 0.01 x the tensor's rms (0.01 x the floor 0.01 for the all-zero biases)
        scale = 0.01 * max(np.sqrt(np.mean(c**2)), 0.01)
        assert 0.7 * scale < np.std(v.numpy() - c[None]) < 1.3 * scale
    with pytest.raises(ValueError, match="expected 4 arrays"):
        model.initialize_particles(center.get_weights()[:2])


def test_dataset_size_from_validation_split_is_the_rows_keras_trains_on():
    x, y = linear_data(n=10)
    model = linear_model(3, 2, bk.likelihoods.Normal(scale=0.5))
    model.compile(optimizer=bk.optimizers.IndependentParticles(1e-3))
    model.fit(x, y, validation_split=0.25, epochs=1, batch_size=10, verbose=0)
    assert model.dataset_size == 7  # Keras trains on floor(10 * 0.75) rows


def test_heteroscedastic_normal_learns_where_the_noise_is():
    """Noise sd 0.1 + 0.6 |x|: the scale head's aleatoric sd at |x| = 1.5 is several times that at x = 0,
    and the log density is the per-particle Gaussian's (scipy) in the targets' units."""
    import scipy.stats

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (600, 1)).astype(np.float32)
    y = (
        100.0 + 20.0 * (x[:, 0] + (0.1 + 0.6 * np.abs(x[:, 0])) * rng.standard_normal(600))
    ).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = bk.zoo.mlp(
        1, 2, (32,), num_particles=4, likelihood=bk.likelihoods.HeteroscedasticNormal()
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, y, epochs=60, batch_size=64, verbose=0)
    grid = np.array([[-1.5], [0.0], [1.5]], np.float32)
    aleatoric = np.sqrt(model.uncertainty(grid)["aleatoric_variance"][:, 0])
    assert aleatoric[0] > 3 * aleatoric[1] and aleatoric[2] > 3 * aleatoric[1], aleatoric
    assert aleatoric[2] == pytest.approx(20.0 * (0.1 + 0.6 * 1.5), rel=0.3)
    outputs = model.predict_particles(grid)
    loc, scale = [t.numpy() for t in model.likelihood.loc_scale(tf.constant(outputs))]
    y_grid = np.array([80.0, 100.0, 130.0], np.float32)
    expected = scipy.stats.norm.logpdf(y_grid[:, None], loc[..., 0], scale[..., 0])
    np.testing.assert_allclose(
        model.likelihood.log_prob(y_grid, tf.constant(outputs)).numpy(), expected, rtol=1e-4
    )


def test_standardisation_is_saved_with_the_model(tmp_path):
    x, y = linear_data(n=80)
    model = linear_model(3, 3, "normal")
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x, 1000.0 + 50.0 * y, epochs=2, verbose=0)
    path = tmp_path / "standardised.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0)["mean"], model.predict(x, verbose=0)["mean"], rtol=1e-6
    )
    assert not loaded.likelihood.adapt_pending
    with pytest.raises(ValueError, match="standardize must be None, True or False"):
        bk.likelihoods.Normal(standardize="yes")
    with pytest.raises(ValueError, match="scale"):
        bk.likelihoods.Normal(scale=float("nan"))
