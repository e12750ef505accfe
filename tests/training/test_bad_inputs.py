"""Bad input to the public API gets a clear ValueError saying what was expected, not an obscure error from
deep inside Keras or TensorFlow, and not a silent wrong answer."""

import os
import tempfile
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk

X = np.random.default_rng(0).random((20, 4)).astype("float32")
Y = (X[:, 0] > 0.5).astype("int32")


def _model():
    inputs = keras.Input((4,))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(2, num_particles=2)(inputs), likelihood="categorical"
    )
    model.compile(optimizer=bk.optimizers.SVGD())
    return model


def _token_model():
    inputs = keras.Input((5,), dtype="int32")
    h = bk.layers.GlobalAveragePooling1D()(bk.layers.Embedding(5, 3, num_particles=2)(inputs))
    return bk.BayesianModel(inputs, bk.layers.Dense(2)(h), likelihood="categorical")


def _scratch(name):
    return os.path.join(tempfile.mkdtemp(), name)


def _twice(path):
    _model().save(path)
    _model().save(path, overwrite=False)


def _softmax_model():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(inputs))


def _predictive():
    logits = np.random.default_rng(1).standard_normal((32, 3)).astype("float32")
    return bk.likelihoods.Categorical().predictive(logits[:, None, :])


CASES = {
    # was UnboundLocalError inside Keras
    "predict on no examples": (
        lambda: _model().predict(X[:0], verbose=0),
        ValueError,
        "no examples",
    ),
    "predict_particles on None": (
        lambda: _model().predict_particles(None),
        ValueError,
        "needs inputs x",
    ),
    "predictive on None": (lambda: _model().predictive(None), ValueError, "needs inputs x"),
    # was "Invalid value in tensor used for shape: -20"
    "fit(batch_size=-1)": (
        lambda: _model().fit(X, Y, batch_size=-1, verbose=0),
        ValueError,
        "batch_size",
    ),
    # was silently the default batch size
    "fit(batch_size=0)": (
        lambda: _model().fit(X, Y, batch_size=0, verbose=0),
        ValueError,
        "batch_size",
    ),
    "predict(batch_size=2.5)": (
        lambda: _model().predict(X, batch_size=2.5, verbose=0),
        ValueError,
        "batch_size",
    ),
    # was silently training on a negative loss
    "negative sample_weight": (
        lambda: _model().fit(X, Y, sample_weight=-np.ones(20), verbose=0),
        ValueError,
        "non-negative",
    ),
    "NaN sample_weight": (
        lambda: _model().fit(X, Y, sample_weight=np.full(20, np.nan), verbose=0),
        ValueError,
        "finite",
    ),
    # was silently training towards the wrong labels (accuracy 0.90 -> 0.10)
    "negative class_weight": (
        lambda: _model().fit(X, Y, class_weight={0: 1.0, 1: -1.0}, verbose=0),
        ValueError,
        "class_weight values must be finite and non-negative.*1: -1.0",
    ),
    "class_weight as a list": (
        lambda: _model().fit(X, Y, class_weight=[1.0, 2.0], verbose=0),
        ValueError,
        "class_weight must be a dict",
    ),
    # trained nothing, silently
    "fit(epochs=-1)": (
        lambda: _model().fit(X, Y, epochs=-1, verbose=0),
        ValueError,
        "epochs must be an integer >= 0",
    ),
    "fit(epochs=2.5)": (
        lambda: _model().fit(X, Y, epochs=2.5, verbose=0),
        ValueError,
        "epochs.*got 2.5",
    ),
    "fit(initial_epoch > epochs)": (
        lambda: _model().fit(X, Y, epochs=2, initial_epoch=3, verbose=0),
        ValueError,
        "initial_epoch \\(3\\) must not exceed epochs \\(2\\)",
    ),
    # was an error after a whole epoch
    "fit(validation_split=-0.1)": (
        lambda: _model().fit(X, Y, validation_split=-0.1, verbose=0),
        ValueError,
        "validation_split must be a fraction",
    ),
    # was a graph error inside the loss
    "fit(y=None) on arrays": (
        lambda: _model().fit(X, verbose=0),
        ValueError,
        "y is None, but x is ndarray",
    ),
    "evaluate(y=None) on arrays": (
        lambda: _model().evaluate(X, verbose=0),
        ValueError,
        "y is None",
    ),
    # hung for ever (memory growing)
    "predict on an infinite dataset": (
        lambda: _model().predict(tf.data.Dataset.from_tensors(X).repeat(), verbose=0),
        ValueError,
        "infinite tf.data.Dataset.*pass steps=",
    ),
    "predict_particles on an infinite dataset": (
        lambda: _model().predict_particles(tf.data.Dataset.from_tensors(X).repeat()),
        ValueError,
        "infinite",
    ),
    "uncertainty on an infinite dataset": (
        lambda: _model().uncertainty(tf.data.Dataset.from_tensors(X).repeat()),
        ValueError,
        "infinite",
    ),
    "evaluate on an infinite dataset": (
        lambda: _model().evaluate(tf.data.Dataset.from_tensors((X, Y)).repeat(), verbose=0),
        ValueError,
        "infinite",
    ),
    "predict(steps=0)": (
        lambda: _model().predict(X, steps=0, verbose=0),
        ValueError,
        "steps must be an integer >= 1",
    ),
    # was "Invalid value in tensor used for shape"
    "predict_particles(batch_size=-2)": (
        lambda: _model().predict_particles(X, batch_size=-2),
        ValueError,
        "batch_size",
    ),
    "uncertainty(batch_size=-2)": (
        lambda: _model().uncertainty(X, batch_size=-2),
        ValueError,
        "batch_size",
    ),
    # plausible wrong numbers: one label broadcast over 32 predictions gave -2.164 (right: -1.294), a (32, 32)
    # matrix of labels -2.923, labels 2.7 were truncated to class 2
    "log_likelihood with one label": (
        lambda: bk.metrics.log_likelihood(_predictive(), np.array([1])),
        ValueError,
        "targets must have the predictive's shape \\(32,\\).*got \\(1,\\)",
    ),
    "log_likelihood with a matrix": (
        lambda: bk.metrics.log_likelihood(_predictive(), np.zeros((32, 32))),
        ValueError,
        "got \\(32, 32\\)",
    ),
    "log_likelihood with labels 2.7": (
        lambda: bk.metrics.log_likelihood(_predictive(), np.full(32, 2.7)),
        ValueError,
        "integer class labels.*2.7",
    ),
    "interval_width with upper < lower": (
        lambda: bk.metrics.interval_width(np.ones(4), np.zeros(4)),
        ValueError,
        "upper bounds are below",
    ),
    # took 3.3 GB
    "calibration_curve(num_bins=10**9)": (
        lambda: bk.metrics.calibration_curve(np.full((4, 2), 0.5), np.zeros(4), num_bins=10**9),
        ValueError,
        "num_bins must be an integer in \\[1, 10000\\]",
    ),
    # wrote a file that load_model refuses
    "save without .keras": (
        lambda: _model().save(_scratch("m")),
        ValueError,
        "filepath must end in '.keras'; got '.*m'",
    ),
    # was EOFError from Keras' overwrite prompt without a terminal
    "save(overwrite=False) over a file": (
        lambda: _twice(_scratch("m.keras")),
        FileExistsError,
        "exists and overwrite=False",
    ),
    # predicted logits where the Keras model predicts probabilities (the softmax was dropped for a Normal likelihood)
    "bayesianize(softmax model, likelihood='normal')": (
        lambda: bk.bayesianize(_softmax_model(), likelihood="normal", noise_std=0.0),
        ValueError,
        "applies softmax, which only the 'categorical' likelihood applies",
    ),
    # a MatMul error deep in the graph
    "fit with 5 features for 4": (
        lambda: _model().fit(np.ones((20, 5)), Y, verbose=0),
        ValueError,
        "x has shape \\(20, 5\\), the model takes \\(batch,\\) \\+ \\(4,\\)",
    ),
    "predict_particles with 5 features": (
        lambda: _model().predict_particles(np.ones((3, 5))),
        ValueError,
        "the model takes",
    ),
    # "Cannot infer the training-set size from list"
    "fit on a list of lists": (
        lambda: _model().fit(X.tolist(), Y, verbose=0),
        ValueError,
        "Python list of lists; pass an array",
    ),
    "predict on a scalar": (
        lambda: _model().predict(np.float32(1.0), verbose=0),
        ValueError,
        "x is a scalar",
    ),
    # was ZeroDivisionError / a graph error at fit
    "Conv2D(strides=0)": (lambda: bk.layers.Conv2D(2, 3, strides=0), ValueError, "strides"),
    "Conv2D(kernel_size=0)": (lambda: bk.layers.Conv2D(2, 0), ValueError, "kernel_size"),
    "Conv2D(kernel_size=True)": (lambda: bk.layers.Conv2D(2, True), ValueError, "kernel_size"),
    "Conv1D(strides=0)": (lambda: bk.layers.Conv1D(2, 3, strides=0), ValueError, "strides"),
    # was a GatherV2 error on CPU (a silent zero vector on GPU)
    "Embedding id >= input_dim": (
        lambda: _token_model().predict(np.full((2, 5), 7), verbose=0),
        tf.errors.InvalidArgumentError,
        "must be < input_dim=5",
    ),
    "Embedding id < 0": (
        lambda: _token_model().predict(np.full((2, 5), -1), verbose=0),
        tf.errors.InvalidArgumentError,
        "must be >= 0",
    ),
    # was IndexError
    "load_digit_tokens(threshold=100)": (
        lambda: bk.datasets.load_digit_tokens(threshold=100),
        ValueError,
        "threshold",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_clearly(name):
    call, error, match = CASES[name]
    with pytest.raises(error, match=match):
        call()


def test_non_finite_inputs_to_prediction_are_warned():
    """They returned NaN without a word."""
    x = X.copy()
    x[3, 1], x[7, 0] = np.nan, np.inf
    model = _model()
    with pytest.warns(RuntimeWarning, match="predict_particles: x holds 2 NaN / Inf"):
        model.predict_particles(x)
    with pytest.warns(RuntimeWarning, match="predict_particles: x holds 2 NaN / Inf"):
        model.uncertainty(x)
    with pytest.warns(RuntimeWarning, match="predict: x holds 2 NaN / Inf"):
        model.predict(x, verbose=0)
    with pytest.warns(
        RuntimeWarning, match="predict: some predictions are NaN: x holds NaN / Inf"
    ):  # a dataset's
        model.predict(tf.data.Dataset.from_tensor_slices(x).batch(8), verbose=0)
    with warnings.catch_warnings(record=True) as caught:  # once per call
        warnings.simplefilter("always")
        model.predict(x, verbose=0)
        model.uncertainty(x)
    assert len([w for w in caught if "NaN / Inf" in str(w.message)]) == 2


def test_a_dataset_size_below_the_rows_given_is_warned():
    with pytest.warns(UserWarning, match="dataset_size=10 is below the 20 training examples given"):
        _model().fit(X, Y, dataset_size=10, epochs=1, verbose=0)


def test_a_generator_without_steps_is_warned_and_still_predicted():
    def batches():
        yield (X[:10],)
        yield (X[10:],)

    with pytest.warns(
        UserWarning, match="predict_particles: x is a generator without a known length"
    ):
        outputs = _model().predict_particles(batches())
    assert outputs.shape == (20, 2, 2)


def test_negative_weights_in_a_dataset_skip_their_step_with_a_warning():
    """A tf.data element's weights cannot be checked before fit: a batch with a negative weight is skipped (the
    particles unchanged) and warned, as a corrupt batch is, instead of training towards the wrong labels."""
    model = _model()
    weights = np.ones(20, "float32")
    weights[10:] = -1.0  # the second batch
    data = tf.data.Dataset.from_tensor_slices((X, Y, weights)).batch(10)
    model.fit(data.take(1), verbose=0)  # builds; one good step
    before = [v.numpy() for v in model.trainable_variables]
    with pytest.warns(
        RuntimeWarning, match="1 training step\\(s\\) skipped.*negative sample weight"
    ):
        model.fit(data.skip(1), verbose=0)
    for b, v in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(b, v.numpy())
    assert model.skipped_steps == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: bk.optimizers.IndependentParticles(beta_1=1.5),
        lambda: bk.optimizers.IndependentParticles(beta_1=np.nan),
        lambda: bk.optimizers.IndependentParticles(epsilon=-1.0),
        lambda: bk.optimizers.MeanFieldVI(beta_2=2.0),
        lambda: bk.optimizers.MeanFieldVI(epsilon=np.nan),
        lambda: bk.optimizers.MGVBP(max_halvings=-1),
        lambda: bk.optimizers.MGVBP(gradient_clip=-1.0),
        lambda: bk.optimizers.MGVBP(initial_precision=np.inf),
        lambda: bk.optimizers.MGVBP(momentum=np.nan),
        lambda: bk.optimizers.GaussianParticleFlow(step_rule=bk.step_rules.DimWiseRMSProp(rho=7.0)),
        lambda: bk.layers.Dense(units=True),
    ],
)
def test_invalid_hyper_parameters_are_refused_at_construction(make):
    """They were accepted, and then every update was skipped (or Dense(units=True) became one unit)."""
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: bk.optimizers.MGVBP(step_rule="adam"),
        lambda: bk.optimizers.MeanFieldVI(step_rule="sgd"),
        lambda: bk.optimizers.IndependentParticles(step_rule="rmsprop"),
    ],
)
def test_a_step_rule_is_refused_where_the_method_has_its_own(make):
    """It was silently dropped: the optimizer ran its own rule."""
    with pytest.raises(ValueError, match="step_rule"):
        make()


def test_one_non_finite_batch_leaves_the_epoch_loss_finite():
    """The step with a NaN batch is refused (particles unchanged, fit warns); the epoch's loss is the mean
    over the steps that were taken (it was NaN)."""
    x = X.copy()
    x[3] = np.nan
    model = _model()
    with pytest.warns(RuntimeWarning, match="skipped"):
        history = model.fit(x, Y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert all(np.all(np.isfinite(v.numpy())) for v in model.particle_variables)
    assert np.isnan(
        model.evaluate(x, Y, verbose=0)[0]
    )  # evaluation on data with a NaN still says so


def test_size_guards_refuse_with_the_estimate_before_building():
    """Dense(num_particles=10**10) looped 10**10 initializer draws (over 180 s for 10**8); MatrixSVGD's mixture
    built an (N, N, D) tensor TensorFlow could not hold ("Cannot parse tensor from proto"). Both are refused
    at build with the memory they would need (sizes far above any machine's memory)."""
    with pytest.raises(
        ValueError,
        match=r"for 10000000000 particles.*would need about .* TB, more than this machine",
    ):
        bk.layers.Dense(10, num_particles=10**10)(keras.Input((10,)))
    inputs = keras.Input((50,))
    h = bk.layers.Dense(10, num_particles=20000, activation="relu")(inputs)
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(1)(h), likelihood=bk.likelihoods.Normal(scale=1.0)
    )
    model.compile(optimizer=bk.optimizers.MatrixSVGD(mode="mixture"))
    with pytest.raises(
        ValueError,
        match=r"mode='mixture'\) with 20000 particles of 521 weights.*Use mode='average'",
    ):
        model.fit(np.zeros((4, 50), np.float32), np.zeros((4, 1), np.float32), verbose=0)


def test_many_particles_are_drawn_at_once_from_the_per_particle_distribution():
    """Keras' random initializers draw every particle in one call on the stacked shape (a per-particle loop took
    minutes for 1e4 particles, and a millisecond per particle and weight always); a fan-based initializer's scale
    is corrected so every particle has the per-particle distribution: Glorot uniform on a (3, 2) kernel has sd
    sqrt(2 / 5), He normal on (3, 2) sqrt(2 / 3). Other seeded initializers are drawn particle by particle, up to
    4,096 particles."""
    few = bk.layers.Dense(300, num_particles=3)
    few(keras.Input((200,)))
    kernel = few.kernel.numpy()
    np.testing.assert_allclose(
        kernel.std(axis=(1, 2)), np.sqrt(2 / 500), rtol=0.01
    )  # each particle's own sd
    assert np.abs(kernel).max() <= np.sqrt(6 / 500)
    assert np.corrcoef(kernel.reshape(3, -1))[0, 1:].max() < 0.02  # independent particles
    identity = bk.layers.Dense(3, num_particles=2, kernel_initializer="identity")
    identity(keras.Input((3,)))
    np.testing.assert_array_equal(identity.kernel.numpy(), np.stack([np.eye(3)] * 2))
    layer = bk.layers.Dense(2, num_particles=20000)
    layer(keras.Input((3,)))
    np.testing.assert_allclose(layer.kernel.numpy().std(), np.sqrt(2 / 5), rtol=0.02)
    assert np.abs(layer.kernel.numpy()).max() <= np.sqrt(6 / 5)  # uniform's limit
    he = bk.layers.Dense(2, num_particles=20000, kernel_initializer="he_normal")
    he(keras.Input((3,)))
    np.testing.assert_allclose(
        he.kernel.numpy().std(), np.sqrt(2 / 3), rtol=0.02
    )  # Keras corrects the truncation
    with pytest.raises(ValueError, match="Orthogonal initializer would be drawn one by one"):
        bk.layers.Dense(2, num_particles=5000, kernel_initializer="orthogonal")(keras.Input((3,)))


def test_mgvbp_score_estimator_defaults_do_not_explode_on_a_network_and_warn():
    """MGVBP(estimator="score") with its defaults took a digits MLP's loss from ~2 to 8e6 in one epoch; with
    the paper's gradient clip (the score estimators' default) the loss stays where it started, and a warning
    says why the estimator does not suit networks."""
    (x, y), _ = bk.datasets.load_digits(seed=0)
    x = x.reshape(len(x), -1)[:256]
    keras.utils.set_random_seed(0)
    model = bk.zoo.mlp(64, 10, (20,), num_particles=10, likelihood="categorical")
    model.compile(optimizer=bk.optimizers.MGVBP(estimator="score"))
    with pytest.warns(
        UserWarning, match="score-function estimator's variance grows with the number of weights"
    ):
        loss = model.fit(x, y[:256], epochs=2, batch_size=64, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss)) and max(loss) < 10.0, loss
    assert bk.optimizers.MGVBP(estimator="score").gradient_clip == 100.0
    assert bk.optimizers.MGVBP().gradient_clip is None


def test_the_size_guard_counts_the_whole_layer_and_the_draw():
    """A 1e9-particle kernel of 3 x 2 (22.4 GiB) passed a per-tensor guard on a 23.5 GiB machine and bayesianize
    then ran for minutes: the guard now counts the layer's weights together and the initial draw's headroom
    (3x), so it is refused at once on any machine with less than ~100 GB."""
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    memory = bk.training.memory_guard.physical_memory_bytes()
    if memory is not None and memory > 90 * 2**30:
        pytest.skip("a machine with more than 90 GiB can hold this layer")
    with pytest.raises(
        ValueError,
        match=r"1000000000 particles.*with the layer's other weights and the initial draw",
    ):
        bk.bayesianize(net, num_particles=10**9, likelihood="normal")


def test_zoo_and_dataset_arguments_are_checked():
    with pytest.raises(ValueError, match=r"mlp hidden must be a sequence of layer widths.*got 4"):
        bk.zoo.mlp(3, 2, 4)
    with pytest.raises(ValueError, match="mlp input_dim must be a positive integer; got 0"):
        bk.zoo.mlp(0, 2, (4,))
    for load in (
        bk.datasets.load_digits,
        bk.datasets.load_breast_cancer,
        bk.datasets.load_diabetes,
    ):
        with pytest.raises(ValueError, match="test_fraction must be a number in"):
            load(test_fraction=1.5)


def test_the_step_guard_counts_optimizer_state_and_n_squared_kernels():
    """SVGD and GaussianParticleFlow hold N x N tensors in a step: at 10^5 particles a tiny layer's step failed in
    numpy ("Unable to allocate 37.3 GiB") or TensorFlow's allocator (OOM, shape [100000,100000]); the optimizer
    now refuses at build, naming the estimate."""
    memory = bk.training.memory_guard.physical_memory_bytes()
    if memory is not None and memory > 500 * 2**30:
        pytest.skip("a machine with more than 500 GiB can hold this step")
    inputs = keras.Input((1,))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(1, num_particles=10**5)(inputs), likelihood="normal"
    )
    model.compile(optimizer=bk.optimizers.SVGD())
    with pytest.raises(
        ValueError,
        match=r"SVGD: a training step with 100000 particles .*16 N x N tensors of 37.3 GB",
    ):
        model.fit(np.zeros((4, 1), "float32"), np.zeros(4, "float32"), verbose=0)
