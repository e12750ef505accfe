"""LowerBoundStopping: the MGVBP paper's stopping rule, checked against a reference run of the rule."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import bayes_keras as bk
from bayes_keras.callbacks import LowerBoundStopping
from targets import (
    class_data,
    keras_round_trip,
    linear_data,
    linear_model,
    paper_mgvbp,
    tiny_classifier,
)

NOISE = 0.5


class _Recorder(keras.callbacks.Callback):
    """Per step: the optimizer's lower bound, the posterior state and the particles after the step."""

    def __init__(self):
        super().__init__()
        self.lower_bounds, self.states, self.particles = [], [], []

    def on_train_batch_end(self, batch, logs=None):
        opt = self.model.optimizer
        self.lower_bounds.append(float(opt.lower_bound.numpy()))
        self.states.append([v.numpy().copy() for v in opt.posterior_variables])
        self.particles.append([v.numpy().copy() for v in self.model.particle_variables])


def _reference_rule(lower_bounds, window, patience):
    """The rule written out directly: (smoothed values, best step, stop step or None), steps 1-based."""
    smoothed, best, best_step, wait = [], -np.inf, None, 0
    for t in range(window, len(lower_bounds) + 1):
        s = np.mean(lower_bounds[t - window : t])
        smoothed.append(s)
        if s > best:
            best, best_step, wait = s, t, 0
        else:
            wait += 1
            if wait >= patience:
                return smoothed, best_step, t
    return smoothed, best_step, None


def _fit_linear(steps, callbacks, optimizer=None, particles=4):
    x, y = linear_data(noise=NOISE)
    model = linear_model(3, particles, bk.likelihoods.Normal(scale=NOISE))
    model.compile(optimizer=optimizer or paper_mgvbp(0.1, structure="diagonal", seed=0))
    ds = tf.data.Dataset.from_tensors((x, y)).repeat(steps)  # full batch, constant learning rate
    model.fit(ds, epochs=1, dataset_size=len(x), shuffle=False, verbose=0, callbacks=callbacks)
    return model


def _allclose(a, b):
    return all(np.allclose(u, v, rtol=0, atol=0) for u, v in zip(a, b))


def test_stops_on_plateau_and_matches_the_rule(capsys):
    steps, window, patience = 2000, 30, 20
    recorder, stopper = _Recorder(), LowerBoundStopping(window, patience, verbose=1)
    model = _fit_linear(steps, [recorder, stopper])
    # The bound plateaus well before 2000 steps: training stopped, and right at the stopping step.
    assert stopper.stopped_step is not None and window + patience <= stopper.stopped_step < steps
    assert (
        int(model.optimizer.iterations.numpy())
        == stopper.stopped_step
        == len(recorder.lower_bounds)
    )
    assert stopper.stopped_step == stopper.best_step + patience
    # Per-step values (not the epoch-mean "elbo" metric), smoothed and compared as the rule says.
    smoothed, best_step, stop_step = _reference_rule(recorder.lower_bounds, window, patience)
    assert (stopper.best_step, stopper.stopped_step) == (best_step, stop_step)
    np.testing.assert_allclose(stopper.history, smoothed, rtol=1e-12)
    assert stopper.best_lower_bound == pytest.approx(max(smoothed), rel=1e-12)
    # The per-step bound is noisy (a running mean would be much smoother); the early steps are far below.
    assert np.std(np.diff(recorder.lower_bounds[-patience:])) > 0
    assert recorder.lower_bounds[0] < stopper.best_lower_bound - 0.1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and f"Step {stop_step}" in out[0] and f"step {best_step}" in out[0]


class _ScriptedOptimizer:
    """Stands in for an MGVBP optimizer: the lower bound and the state are set by the test."""

    def __init__(self):
        self.lower_bound = keras.Variable(0.0, dtype="float32", trainable=False)
        self.state = keras.Variable(0.0, dtype="float64", trainable=False)
        self.posterior_variables = [self.state]
        self.resampled = 0

    def resample(self):
        self.resampled += 1


class _ScriptedModel:
    def __init__(self):
        self.optimizer, self.stop_training = _ScriptedOptimizer(), False


def _drive(stopper, lower_bounds):
    """Runs the callback over a scripted lower-bound sequence; the state after step t is t."""
    model = _ScriptedModel()
    stopper.set_model(model)
    stopper.on_train_begin()
    for t, lb in enumerate(lower_bounds, start=1):
        model.optimizer.lower_bound.assign(lb)
        model.optimizer.state.assign(float(t))
        stopper.on_train_batch_end(t - 1)
        if model.stop_training:
            break
    stopper.on_train_end()
    return model


def test_rule_on_scripted_lower_bounds():
    # A flat bound: the first smoothed value (step W) is the best; equal values are no improvement.
    stopper = LowerBoundStopping(window=4, patience=3)
    model = _drive(stopper, [1.0] * 50)
    assert (stopper.best_step, stopper.stopped_step) == (4, 7) and model.stop_training
    assert float(model.optimizer.state.numpy()) == 4.0 and model.optimizer.resampled == 1
    # Rising then falling: best where the window mean peaks; a NaN step is never an improvement.
    lbs = [0, 1, 2, 3, 4, 5, 6, 5, 4, float("nan"), 10, 10, 10, 10, 10]
    stopper = LowerBoundStopping(window=3, patience=4)
    model = _drive(stopper, lbs)
    smoothed, best_step, stop_step = _reference_rule(lbs, 3, 4)
    assert (stopper.best_step, stopper.stopped_step) == (best_step, stop_step) == (8, 12)
    np.testing.assert_allclose(stopper.history, smoothed[: len(stopper.history)], equal_nan=True)
    assert (
        stopper.best_lower_bound == pytest.approx(16 / 3)
        and float(model.optimizer.state.numpy()) == 8.0
    )
    # A non-finite first smoothed value does not become the best.
    stopper = LowerBoundStopping(window=2, patience=2)
    _drive(stopper, [float("nan"), 1, 1, 2, 2, 2, 2])
    assert (stopper.best_step, stopper.stopped_step) == (5, 7) and stopper.best_lower_bound == 2.0
    # Still improving at the end: no stop, but the best (here the last) state is restored.
    stopper = LowerBoundStopping(window=2, patience=2, restore_best=False)
    model = _drive(stopper, [0, 1, 2, 3])
    assert (
        stopper.stopped_step is None and stopper.best_step == 4 and model.optimizer.resampled == 0
    )


def test_steps_are_counted_across_epochs():
    x, y = linear_data(noise=NOISE)
    model = linear_model(3, 4, bk.likelihoods.Normal(scale=NOISE))
    model.compile(optimizer=paper_mgvbp(0.1, structure="diagonal", seed=0))
    recorder, stopper = _Recorder(), LowerBoundStopping(window=10, patience=5)
    history = model.fit(
        x, y, batch_size=20, epochs=300, shuffle=False, verbose=0, callbacks=[recorder, stopper]
    )
    assert stopper.stopped_step is not None and stopper.stopped_step < 900  # 3 steps per epoch
    assert int(model.optimizer.iterations.numpy()) == stopper.stopped_step
    assert (
        len(history.history["loss"]) == (stopper.stopped_step + 2) // 3
    )  # stopped mid-run, not at epoch 300
    _, best_step, stop_step = _reference_rule(recorder.lower_bounds, 10, 5)
    assert (stopper.best_step, stopper.stopped_step) == (best_step, stop_step)


def test_restores_best_posterior_and_resamples_particles():
    recorder, stopper = _Recorder(), LowerBoundStopping(window=30, patience=20)
    model = _fit_linear(2000, [recorder, stopper])
    opt = model.optimizer
    assert stopper.stopped_step > stopper.best_step
    restored = [v.numpy() for v in opt.posterior_variables]
    best, last = recorder.states[stopper.best_step - 1], recorder.states[-1]
    # q is exactly the state after the best step, which differs from the state after the last step.
    assert _allclose(restored, best)
    assert not _allclose(restored, last)
    assert not np.allclose(restored[0], last[0])  # the first block's mean moved after the best step
    # The particles were redrawn (they are not the last step's samples) from the restored q.
    particles = [v.numpy() for v in model.particle_variables]
    assert not any(np.allclose(p, q) for p, q in zip(particles, recorder.particles[-1]))
    marginals = opt.posterior(flatten=False)
    for v, p in zip(model.particle_variables, particles):
        q = marginals[v.path]
        mean, sd = q.distribution.loc.numpy(), q.distribution.scale.numpy()
        z = (p.reshape(p.shape[0], -1) - mean) / sd
        assert np.all(np.abs(z) < 6), (v.path, z)
    first = marginals[model.particle_variables[0].path].distribution.loc.numpy()
    np.testing.assert_allclose(
        first, best[0][: first.size], rtol=1e-12
    )  # block 0 starts with variable 0


def test_restore_best_false_keeps_the_last_state():
    recorder, stopper = _Recorder(), LowerBoundStopping(window=30, patience=20, restore_best=False)
    model = _fit_linear(2000, [recorder, stopper])
    assert stopper.stopped_step is not None
    assert _allclose([v.numpy() for v in model.optimizer.posterior_variables], recorder.states[-1])
    assert _allclose([v.numpy() for v in model.particle_variables], recorder.particles[-1])


def test_mean_field_vi_and_short_runs():
    x, y = class_data()
    model = tiny_classifier()
    model.compile(optimizer=bk.optimizers.MeanFieldVI(1e-2, seed=0))
    recorder, stopper = _Recorder(), LowerBoundStopping(window=5, patience=1000)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[recorder, stopper])  # 8 steps
    assert stopper.stopped_step is None and len(stopper.history) == 4
    assert _allclose(
        [v.numpy() for v in model.optimizer.posterior_variables],
        recorder.states[stopper.best_step - 1],
    )
    # Fewer steps than the window: no smoothed value, nothing to restore, and a second fit starts afresh.
    recorder2, short = _Recorder(), LowerBoundStopping(window=30)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[recorder2, short])
    assert short.best_lower_bound is None and short.best_step is None and short.history == []
    assert _allclose([v.numpy() for v in model.optimizer.posterior_variables], recorder2.states[-1])
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[stopper])
    assert len(stopper.history) == 0 and stopper.best_step is None


def test_optimizer_without_lower_bound_raises():
    x, y = linear_data(noise=NOISE)
    model = linear_model(3, 4, bk.likelihoods.Normal(scale=NOISE))
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    with pytest.raises(
        ValueError, match="GaussianParticleFlow has no `lower_bound`, `posterior_variables`"
    ):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[LowerBoundStopping()])


def test_invalid_arguments():
    for kwargs in ({"window": 0}, {"patience": 0}, {"window": 2.5}, {"patience": True}):
        with pytest.raises(ValueError, match="positive integer"):
            LowerBoundStopping(**kwargs)


def test_config_round_trip():
    stopper = LowerBoundStopping(window=7, patience=3, restore_best=False, verbose=1)
    config = stopper.get_config()
    assert config == {"window": 7, "patience": 3, "restore_best": False, "verbose": 1}
    assert LowerBoundStopping.from_config(config).get_config() == config
    assert keras.saving.get_registered_name(LowerBoundStopping) == "bayes_keras>LowerBoundStopping"
    restored = keras_round_trip(stopper, None)
    assert isinstance(restored, LowerBoundStopping) and restored.get_config() == config


def test_tensorboard_shows_the_particle_metrics_and_the_bound(tmp_path):
    """keras.callbacks.TensorBoard (tensorboard is installed with the package) writes the loss, the particle
    metrics and the optimizer's bound; read back from the event files."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    inputs = keras.Input((4,))
    h = bk.layers.Dense(8, activation="relu", num_particles=4)(inputs)
    model = bk.BayesianModel(inputs, bk.layers.Dense(2)(h), likelihood="categorical")
    model.compile(
        optimizer=bk.optimizers.MGVBP(), metrics=["accuracy", bk.metrics.ExpectedCalibrationError()]
    )
    model.fit(
        x,
        y,
        epochs=2,
        batch_size=16,
        validation_split=0.25,
        verbose=0,
        callbacks=[keras.callbacks.TensorBoard(str(tmp_path))],
    )
    tags = set()
    for run in ("train", "validation"):
        events = EventAccumulator(str(tmp_path / run), size_guidance={"tensors": 0})
        events.Reload()
        tags |= {f"{run}/{t}" for t in events.Tags()["tensors"]}
        values = [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors("epoch_loss")]
        assert len(values) == 2 and np.all(np.isfinite(values))
    for tag in (
        "train/epoch_loss",
        "train/epoch_accuracy",
        "train/epoch_ece",
        "train/epoch_nll",
        "train/epoch_elbo",
        "validation/epoch_loss",
        "validation/epoch_accuracy",
    ):
        assert tag in tags, sorted(tags)
