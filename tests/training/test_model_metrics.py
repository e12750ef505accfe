"""Every metric fit / evaluate reports equals the same quantity computed by hand from predict() on the
same data: for each likelihood, before and after fit, at any batch size."""

import keras
import numpy as np
import pytest
import scipy.optimize
import scipy.special
import scipy.stats

import bayes_keras as bk


def _classification_data(n=90, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    return x, rng


def _model(likelihood, outputs, n_particles=3, shared_head=False):
    inputs = keras.Input((4,))
    h = bk.layers.Dense(6, activation="tanh", num_particles=n_particles)(inputs)
    out = bk.layers.Dense(outputs, deterministic=shared_head)(h)
    return bk.BayesianModel(inputs, out, likelihood=likelihood)


def _cases():
    x, rng = _classification_data()
    y_cat = np.argmax(x[:, :3] + 0.5 * rng.standard_normal((len(x), 3)), 1).astype(np.int32)
    y_bin = (x[:, 0] + 0.5 * rng.standard_normal(len(x)) > 0).astype(np.float32)
    y_reg = (40.0 + 25.0 * x[:, 0] + 10.0 * rng.standard_normal(len(x))).astype(
        np.float32
    )  # unscaled targets
    return {
        "categorical": (
            x,
            y_cat,
            lambda: _model("categorical", 3),
            ["accuracy", bk.metrics.ExpectedCalibrationError(5), bk.metrics.BrierScore()],
        ),
        "bernoulli": (
            x,
            y_bin,
            lambda: _model("bernoulli", 1),
            ["accuracy", bk.metrics.ExpectedCalibrationError(5), bk.metrics.BrierScore()],
        ),
        "normal": (
            x,
            y_reg,
            lambda: _model(bk.likelihoods.Normal(scale=5.0), 1, shared_head=True),
            ["mae", bk.metrics.IntervalCoverage(0.9), bk.metrics.IntervalWidth(0.9)],
        ),
    }


def _log_likelihood(kind, outputs, y, scale=5.0):
    """(batch, N) log p(y_b | w_n) in numpy."""
    if kind == "categorical":
        return scipy.special.log_softmax(outputs, -1)[np.arange(len(y)), :, y.astype(int)]
    if kind == "bernoulli":
        f = outputs[..., 0]
        return -np.logaddexp(0.0, -f) * y[:, None] - np.logaddexp(0.0, f) * (1 - y[:, None])
    return scipy.stats.norm.logpdf(y[:, None], outputs[..., 0], scale)


def _mixture_quantile(means, scale, p):
    cdf = lambda t: np.mean(scipy.stats.norm.cdf(t, means, scale)) - p  # noqa: E731
    return scipy.optimize.brentq(
        cdf, means.min() - 20 * scale, means.max() + 20 * scale, xtol=1e-10
    )


def _expected(kind, model, x, y, dataset_size):
    """The reported metrics, computed from predict_particles / predict and the weights in numpy."""
    outputs = model.predict_particles(x).astype(np.float64)
    n = outputs.shape[1]
    loglik = _log_likelihood(kind, outputs, y)
    # default priors N(0, 1) on every weight; the shared head's weights are one set
    particle_prior = sum(
        np.sum(scipy.stats.norm.logpdf(v.numpy()).reshape(n, -1), 1)
        for v in model.particle_variables
    )
    shared_prior = sum(
        np.sum(scipy.stats.norm.logpdf(v.numpy()))
        for v in model.trainable_variables
        if not getattr(v, "is_particle_variable", False)
    )
    log_joint = dataset_size * loglik.mean(0) + particle_prior
    expected = {
        "loss": -(log_joint.mean() + shared_prior) / dataset_size,
        "nll": -np.mean(scipy.special.logsumexp(loglik, 1) - np.log(n)),
    }
    if kind == "normal":
        mean = model.predict(x, verbose=0)["mean"][:, 0]
        expected["mae"] = np.mean(np.abs(mean - y))
        lower = np.array([_mixture_quantile(o[:, 0], 5.0, 0.05) for o in outputs])
        upper = np.array([_mixture_quantile(o[:, 0], 5.0, 0.95) for o in outputs])
        expected["coverage_90"] = np.mean((y >= lower) & (y <= upper))
        expected["width_90"] = np.mean(upper - lower)
    else:
        probs = model.predict(x, verbose=0)
        expected["accuracy"] = bk.metrics.accuracy(probs, y)
        expected["ece"] = bk.metrics.ece(probs, y, num_bins=5)
        expected["brier"] = bk.metrics.brier(probs, y)
    return expected


@pytest.mark.parametrize("kind", ["categorical", "bernoulli", "normal"])
def test_reported_metrics_equal_predict(kind):
    x, y, build, metrics = _cases()[kind]
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2), metrics=metrics)
    # before fit: the training-set size is unknown, so evaluate's loss uses the evaluated data's
    before = model.evaluate(x, y, batch_size=7, verbose=0, return_dict=True)
    expected = _expected(kind, model, x, y, dataset_size=len(x))
    assert set(before) == set(expected)
    for name, value in expected.items():
        assert before[name] == pytest.approx(value, rel=1e-4, abs=1e-5), (name, "before fit")
    history = model.fit(
        x[:60], y[:60], epochs=2, batch_size=16, validation_data=(x[60:], y[60:]), verbose=0
    )
    assert model.dataset_size == 60
    val_expected = _expected(kind, model, x[60:], y[60:], dataset_size=60)
    for name, value in val_expected.items():
        assert history.history["val_" + name][-1] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    assert "val_free_energy" not in history.history and "free_energy" in history.history
    expected = _expected(kind, model, x, y, dataset_size=60)
    for batch_size in (1, 7, 64, len(x)):
        after = model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
        for name, value in expected.items():
            assert after[name] == pytest.approx(value, rel=1e-4, abs=1e-5), (name, batch_size)
    values = model.evaluate(x, y, verbose=0)
    assert sorted(model.metrics_names) == sorted(expected) and model.metrics_names[0] == "loss"
    for name, value in zip(model.metrics_names, values):
        assert value == pytest.approx(expected[name], rel=1e-4, abs=1e-5), name


def test_sample_weights_weigh_loss_and_nll():
    x, y, build, _ = _cases()["categorical"]
    model = build()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2), dataset_size=90)
    w = np.random.default_rng(1).uniform(0.0, 2.0, len(x)).astype(np.float32)
    logs = model.evaluate(x, y, sample_weight=w, batch_size=16, verbose=0, return_dict=True)
    outputs = model.predict_particles(x).astype(np.float64)
    loglik = _log_likelihood("categorical", outputs, y)
    nll = -(scipy.special.logsumexp(loglik, 1) - np.log(outputs.shape[1]))
    assert logs["nll"] == pytest.approx(np.sum(w * nll) / np.sum(w), rel=1e-4)
    prior = sum(
        np.sum(scipy.stats.norm.logpdf(v.numpy()).reshape(3, -1), 1)
        for v in model.particle_variables
    )
    # Keras' convention: weighted per-example losses averaged over the examples (not the weights)
    expected_loss = -(np.mean(w[:, None] * loglik, 0) + prior / 90).mean()
    assert logs["loss"] == pytest.approx(expected_loss, rel=1e-4)


def test_early_stopping_auto_mode_knows_directions():
    x, y, build, _ = _cases()["categorical"]
    model = build()
    model.compile(
        optimizer=bk.optimizers.GaussianParticleFlow(1e-2),
        metrics=["accuracy", bk.metrics.ExpectedCalibrationError()],
    )
    callbacks = [
        keras.callbacks.EarlyStopping(monitor=m, patience=50)
        for m in ("val_nll", "val_loss", "val_accuracy", "val_ece", "free_energy")
    ]
    model.fit(x, y, epochs=2, validation_split=0.25, callbacks=callbacks, verbose=0)
    ops = {cb.monitor: cb.monitor_op.__name__ for cb in callbacks}
    assert ops == {
        "val_nll": "less",
        "val_loss": "less",
        "val_accuracy": "greater",
        "val_ece": "less",
        "free_energy": "less",
    }


def test_dataset_size_follows_each_fit_unless_given():
    x, y, build, _ = _cases()["categorical"]
    model = build()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    model.fit(x[:16], y[:16], verbose=0)
    assert model.dataset_size == 16
    model.fit(x, y, validation_split=0.3, verbose=0)
    assert (
        model.dataset_size == 62
    )  # int(floor(90 * (1 - 0.3))) = 62 in floating point: the rows Keras trains on
    with pytest.raises(ValueError, match="no examples"):
        model.fit(x[:0], y[:0], verbose=0)
    model.fit(x[:16], y[:16], dataset_size=1000, verbose=0)
    model.fit(x, y, verbose=0)
    assert model.dataset_size == 1000  # given by the user: kept


def test_accuracy_refused_for_regression():
    x, y, build, _ = _cases()["normal"]
    model = build()
    with pytest.raises(ValueError, match="not defined for the Normal likelihood"):
        model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2), metrics=["accuracy"])


def test_interval_metrics_refused_for_classification():
    x, y, build, _ = _cases()["categorical"]
    model = build()
    model.compile(
        optimizer=bk.optimizers.GaussianParticleFlow(1e-2), metrics=[bk.metrics.IntervalCoverage()]
    )
    with pytest.raises(ValueError, match="Predictive intervals need a continuous likelihood"):
        model.evaluate(x, y, verbose=0)


def test_metric_name_clash_is_an_error():
    _, _, build, _ = _cases()["categorical"]
    model = build()
    with pytest.raises(ValueError, match="unique"):
        model.compile(
            optimizer=bk.optimizers.GaussianParticleFlow(1e-2),
            metrics=[bk.metrics.PredictiveNegativeLogLikelihood()],
        )
