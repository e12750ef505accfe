"""Transfer learning: a frozen backbone converts, only the Bayesian part trains, the layers before the particle axis
run once per example; bayesian= chooses the Bayesian part; no false warnings on load or clone; multi-input export;
scikit-learn estimators."""

import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.model_selection import cross_val_score

import bayes_keras as bk


def _backbone_model(frozen=True):
    """A small CNN backbone (nested Sequential, randomised BatchNormalization statistics) with a softmax head."""
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, activation="relu", name="c1"),
            keras.layers.BatchNormalization(name="bn1"),
            keras.layers.Conv2D(8, 3, activation="relu", name="c2"),
            keras.layers.BatchNormalization(name="bn2"),
        ],
        name="backbone",
    )
    rng = np.random.default_rng(0)
    for name in ("bn1", "bn2"):
        layer = backbone.get_layer(name)
        layer.moving_mean.assign(rng.standard_normal(8).astype("float32"))
        layer.moving_variance.assign(rng.uniform(0.5, 1.5, 8).astype("float32"))
    backbone.trainable = not frozen
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.GlobalAveragePooling2D(name="pool")(backbone(inputs))
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(h)
    return keras.Model(inputs, outputs)


def _data(n=64):
    rng = np.random.default_rng(1)
    return rng.uniform(size=(n, 8, 8, 1)).astype("float32"), rng.integers(0, 10, n)


def _axis_free(model, name):
    """Whether the model's graph has no particle axis at layer `name`'s output (the Keras model's shape)."""
    return tuple(model.get_layer(name).output.shape[1:]) == (4, 4, 8)


def test_frozen_backbone_converts_and_only_the_head_trains():
    keras_model = _backbone_model()
    x, y = _data()
    model = bk.bayesianize(keras_model, num_particles=4, noise_std=0.0)
    # exact at noise 0, in inference and in training mode (frozen BatchNormalization uses its statistics)
    for training in (False, True):
        np.testing.assert_allclose(
            tf.nn.softmax(model(x, training=training)).numpy(),
            np.broadcast_to(keras_model(x).numpy()[:, None], (64, 4, 10)),
            atol=1e-6,
        )
    # the backbone is a Keras model before the particle axis: its output has no particle axis
    assert isinstance(model.get_layer("backbone"), keras.Sequential)
    assert tuple(model.get_layer("backbone").output.shape[1:]) == (4, 4, 8)
    assert [v.path for v in model.trainable_variables] == ["head/kernel", "head/bias"]
    report = bk.conversion_report(model)
    assert [(r.name, r.role, r.trainable) for r in report.rows] == [
        ("c1", "keras", False),
        ("bn1", "keras", False),
        ("c2", "keras", False),
        ("bn2", "keras", False),
        ("head", "bayesian", True),
    ]
    assert report.bayesian_fraction == pytest.approx(90 / (80 + 32 + 584 + 32 + 90))
    before = [v.numpy().copy() for v in model.get_layer("backbone").weights]
    head = model.get_layer("head").kernel.numpy().copy()
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.initialize_particles(
        [keras_model.get_layer("head").kernel.numpy(), keras_model.get_layer("head").bias.numpy()],
        noise_std=0.1,
        seed=0,
    )
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    for old, new in zip(
        before, model.get_layer("backbone").weights
    ):  # weights and BN statistics unchanged
        np.testing.assert_array_equal(old, new.numpy())
    assert not np.allclose(head, model.get_layer("head").kernel.numpy())


def test_the_backbone_runs_once_per_example():
    """Counted: a layer before the particle axis is called on (batch, ...) tensors, once per step."""
    calls = []

    class Counting(keras.layers.Layer):
        def call(self, x):
            calls.append(tuple(x.shape))
            return x

    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(5, trainable=False, name="frozen")(inputs)
    h = Counting(name="probe")(h)
    outputs = keras.layers.Dense(3, name="head")(h)
    model = bk.bayesianize(keras.Model(inputs, outputs), num_particles=7, likelihood="categorical")
    calls.clear()
    model(np.zeros((4, 6), np.float32))
    assert calls == [(4, 5)]  # no particle axis, one call
    assert isinstance(model.get_layer("frozen"), keras.layers.Dense)
    assert not isinstance(model.get_layer("frozen"), bk.layers.ParticleLayer)


@pytest.mark.parametrize(
    "bayesian, roles",
    [
        (
            None,
            {
                "c1": "bayesian",
                "bn1": "bayesian",
                "c2": "bayesian",
                "bn2": "bayesian",
                "head": "bayesian",
            },
        ),
        (
            ["head"],
            {"c1": "keras", "bn1": "keras", "c2": "keras", "bn2": "keras", "head": "bayesian"},
        ),
        (
            2,
            {
                "c1": "keras",
                "bn1": "keras",
                "c2": "bayesian",
                "bn2": "bayesian",
                "head": "bayesian",
            },
        ),
        (
            lambda layer: layer.name in ("c2", "head"),
            {"c1": "keras", "bn1": "keras", "c2": "bayesian", "bn2": "shared", "head": "bayesian"},
        ),
        (
            ["backbone"],
            {
                "c1": "bayesian",
                "bn1": "bayesian",
                "c2": "bayesian",
                "bn2": "bayesian",
                "head": "shared",
            },
        ),
    ],
)
def test_bayesian_chooses_the_bayesian_part(bayesian, roles):
    keras_model = _backbone_model(frozen=False)
    model = bk.bayesianize(keras_model, num_particles=3, noise_std=0.0, bayesian=bayesian)
    assert {r.name: r.role for r in bk.conversion_report(model).rows} == roles
    x, _ = _data(8)
    np.testing.assert_allclose(
        tf.nn.softmax(model(x)).numpy(),
        np.broadcast_to(keras_model(x).numpy()[:, None], (8, 3, 10)),
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"bayesian": ["nope"]}, r"does not have: \['nope'\]"),
        ({"deterministic": ["nope"]}, r"does not have: \['nope'\]"),
        ({"bayesian": 0}, "give 1 to 3"),
        ({"bayesian": 4}, "give 1 to 3"),
        ({"bayesian": ["pool"]}, "without a particle version"),
        ({"bayesian": ["head"], "deterministic": ["head"]}, "both in bayesian= and deterministic="),
        ({"bayesian": 2.5}, "list of layer names or a callable layer -> bool, or an int k"),
        ({"bayesian": lambda: True}, "callable that takes a keras layer"),
        ({"deterministic": lambda: True}, "callable that takes a keras layer"),
        ({"bayesian": ["head"], "deterministic": lambda layer: True}, "deterministic= takes away"),
        ({"num_particles": 0}, "num_particles must be a positive integer; got 0"),
    ],
)
def test_bad_bayesian_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bk.bayesianize(_backbone_model(), **kwargs)


def test_long_layer_lists_are_elided_in_errors():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    h = inputs
    for i in range(40):
        h = keras.layers.Dense(4, name=f"d{i}")(h)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="head")(h))
    with pytest.raises(ValueError, match=r"'d0', .*\.\.\. .*'head'\] \(41 in all") as refused:
        bk.bayesianize(model, bayesian=["nope"])
    assert "'d20'" not in str(refused.value)


def test_frozen_model_with_nothing_bayesian_is_refused():
    keras_model = _backbone_model()
    keras_model.trainable = False
    with pytest.raises(ValueError, match="no layer .* would carry particles"):
        bk.bayesianize(keras_model)


def test_two_stage_fine_tuning():
    """Stage 1: a Bayesian head on the frozen backbone; stage 2: unfreeze the backbone's last convolution,
    recompile, fit: it trains (as one shared point estimate), the rest stays."""
    x, y = _data()
    model = bk.bayesianize(_backbone_model(), num_particles=3)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, y, epochs=1, verbose=0)
    backbone = model.get_layer("backbone")
    backbone.trainable = True
    for layer in backbone.layers[:-2]:
        layer.trainable = False
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-3))
    first = backbone.get_layer("c1").kernel.numpy().copy()
    last = backbone.get_layer("c2").kernel.numpy().copy()
    model.fit(x, y, epochs=1, verbose=0)
    np.testing.assert_array_equal(first, backbone.get_layer("c1").kernel.numpy())
    assert not np.allclose(last, backbone.get_layer("c2").kernel.numpy())


def _identical_warnings(record):
    return [w for w in record if "are identical" in str(w.message)]


def test_no_false_identical_particles_warning_on_load_or_clone(tmp_path):
    x, y = _data()
    model = bk.bayesianize(_backbone_model(frozen=False), num_particles=3)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, y, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        loaded = keras.models.load_model(path)
        loaded.fit(x, y, epochs=1, verbose=0)
        clone = keras.models.clone_model(model)
        clone.set_weights(model.get_weights())
        clone.fit(x, y, epochs=1, verbose=0)
        # a clone WITHOUT the weights (the scikit-learn wrappers' clone) initialises every particle of a converted
        # layer apart, biases included (Keras' zeros would leave them identical, and GPF keeps them so)
        fresh = keras.models.clone_model(model)
        head = fresh.get_layer("head")
        assert float(np.min(np.std(head.bias.numpy(), axis=0))) > 1e-3
        fresh.fit(x, y, epochs=1, verbose=0)
    assert _identical_warnings(record) == []


def test_identical_particles_still_warn():
    x, y = _data()
    model = bk.bayesianize(_backbone_model(), num_particles=3, noise_std=0.0)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.fit(x, y, epochs=1, verbose=0)
    assert {str(w.message).split(" are")[0] for w in _identical_warnings(record)} == {
        "GaussianParticleFlow: all particles of head/kernel",
        "GaussianParticleFlow: all particles of head/bias",
    }


def _two_input_model(as_dict=False):
    keras.utils.set_random_seed(0)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    h = bk.layers.Dense(8, num_particles=3, activation="relu")(keras.layers.Concatenate()([a, b]))
    outputs = bk.layers.Dense(1)(h)
    return bk.BayesianModel({"a": a, "b": b} if as_dict else [a, b], outputs, likelihood="normal")


@pytest.mark.parametrize(
    "as_dict, signature",
    [(False, None), (False, "flat"), (False, "nested"), (True, None), (True, "dict")],
)
def test_multi_input_export(as_dict, signature, tmp_path):
    model = _two_input_model(as_dict)
    specs = [tf.TensorSpec((None, 3), tf.float32), tf.TensorSpec((None, 2), tf.float32)]
    given = {None: None, "flat": specs, "nested": [specs], "dict": {"a": specs[0], "b": specs[1]}}[
        signature
    ]
    rng = np.random.default_rng(0)
    x = [
        rng.standard_normal((5, 3)).astype("float32"),
        rng.standard_normal((5, 2)).astype("float32"),
    ]
    x = {"a": x[0], "b": x[1]} if as_dict else x
    path = os.path.join(tmp_path, "served")
    model.export(path, input_signature=given, verbose=False)
    served = tf.saved_model.load(path)
    np.testing.assert_allclose(
        served.serve(x)["mean"].numpy(), model.predict(x, verbose=0)["mean"], atol=1e-6
    )
    assert served.quantiles(x, tf.constant([0.1, 0.5, 0.9])).shape == (5, 3, 1)


@pytest.mark.parametrize("structure", ["single", "dict"])
def test_converted_models_keep_their_input_structure(structure, tmp_path):
    """bayesianize keeps one input a tensor and a dict a dict: fit, predict and the served endpoints take them
    as the Keras model does (serve(x) for one input, as the README shows)."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if structure == "single":
        keras_model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(4, activation="relu"),
                keras.layers.Dense(3, activation="softmax"),
            ]
        )
        x = rng.standard_normal((6, 3)).astype("float32")
    else:
        a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
        h = keras.layers.Concatenate()([keras.layers.Dense(4)(a), b])
        keras_model = keras.Model({"a": a, "b": b}, keras.layers.Dense(3, activation="softmax")(h))
        x = {
            "a": rng.standard_normal((6, 3)).astype("float32"),
            "b": rng.standard_normal((6, 2)).astype("float32"),
        }
    model = bk.bayesianize(keras_model, num_particles=2)
    assert not isinstance(model.input, list) and isinstance(model.input, dict) == (
        structure == "dict"
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, np.arange(6) % 3, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "served")
    model.export(path, verbose=False)
    served = tf.saved_model.load(path)
    np.testing.assert_allclose(
        served.serve(x)["probabilities"].numpy(), model.predict(x, verbose=0), atol=1e-6
    )
    model.save(os.path.join(tmp_path, "model.keras"))
    loaded = keras.models.load_model(os.path.join(tmp_path, "model.keras"))
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_multi_input_export_refuses_a_wrong_count(tmp_path):
    with pytest.raises(ValueError, match="2 inputs; pass one tf.TensorSpec per input"):
        _two_input_model().export(
            os.path.join(tmp_path, "x"),
            verbose=False,
            input_signature=[tf.TensorSpec((None, 3))] * 3,
        )


def test_scikit_learn_cross_validation():
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = (
        (x[order] - x.mean(0)) / x.std(0),
        np.array(["setosa", "versicolor", "virginica"])[y[order]],
    )
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    h = bk.layers.Dense(16, activation="relu", num_particles=4)(inputs)
    model = bk.BayesianModel(inputs, bk.layers.Dense(3)(h), likelihood="categorical")
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2))
    classifier = bk.wrappers.SKLearnClassifier(model, fit_kwargs={"epochs": 20, "verbose": 0})
    scores = cross_val_score(classifier, x, y, cv=3)
    assert scores.min() > 0.8, scores
    fitted = classifier.fit(x, y)
    assert set(fitted.predict(x[:5])) <= set(fitted.classes_)
    np.testing.assert_allclose(fitted.predict_proba(x[:5]).sum(1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="wrap a BayesianModel"):
        bk.wrappers.SKLearnClassifier(
            keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        ).fit(x, y)
