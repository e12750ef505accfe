"""Keras idioms a user brings: loss objects, output activations, plain Keras optimizers, clone_model."""

import warnings

import keras
import numpy as np
import pytest

import bayes_keras as bk


def _classifier(classes=3, activation=None, n=3):
    inputs = keras.Input((4,))
    h = bk.layers.Dense(8, activation="relu", num_particles=n)(inputs)
    return inputs, bk.layers.Dense(classes, activation=activation)(h)


@pytest.mark.parametrize(
    "loss, likelihood",
    [
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), bk.likelihoods.Categorical),
        (keras.losses.BinaryCrossentropy(from_logits=True), bk.likelihoods.Bernoulli),
        (keras.losses.MeanSquaredError(), bk.likelihoods.Normal),
        ("sparse_categorical_crossentropy", bk.likelihoods.Categorical),
    ],
)
def test_loss_objects_map_onto_likelihoods(loss, likelihood):
    assert isinstance(bk.likelihoods.get(loss), likelihood)


@pytest.mark.parametrize(
    "loss, message",
    [
        (keras.losses.SparseCategoricalCrossentropy(), "from_logits=False"),
        (keras.losses.BinaryCrossentropy(), "from_logits=False"),
        (keras.losses.CategoricalCrossentropy(from_logits=True), "one-hot"),
        (keras.losses.BinaryCrossentropy(from_logits=True, label_smoothing=0.1), "label_smoothing"),
        (keras.losses.MeanAbsoluteError(), "No likelihood corresponds"),
    ],
)
def test_ambiguous_losses_are_refused(loss, message):
    inputs, logits = _classifier()
    model = bk.BayesianModel(inputs, logits)
    with pytest.raises(ValueError, match=message):
        model.compile(optimizer=bk.optimizers.SVGD(), loss=loss)


def test_compile_with_a_loss_object_trains_like_the_likelihood():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = np.argmax(x[:, :3], 1)
    results = []
    for kwargs in (
        {"loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        {"likelihood": "categorical"},
    ):
        keras.utils.set_random_seed(0)
        inputs, logits = _classifier()
        model = bk.BayesianModel(inputs, logits)
        model.compile(optimizer=bk.optimizers.SVGD(1e-2), **kwargs)
        model.fit(x, y, epochs=2, verbose=0)
        results.append(model.predict(x, verbose=0))
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize(
    "activation, likelihood", [("softmax", "categorical"), ("sigmoid", "bernoulli")]
)
def test_squashed_outputs_are_refused(activation, likelihood):
    inputs, out = _classifier(
        classes=3 if likelihood == "categorical" else 1, activation=activation
    )
    with pytest.raises(ValueError, match=f"applies {activation}.*logits"):
        bk.BayesianModel(inputs, out, likelihood=likelihood)
    model = bk.BayesianModel(inputs, out)  # the likelihood given later: checked then
    with pytest.raises(ValueError, match="Remove the output activation"):
        model.compile(optimizer=bk.optimizers.SVGD(), likelihood=likelihood)


def test_plain_keras_optimizer_is_warned_about():
    inputs, logits = _classifier()
    model = bk.BayesianModel(inputs, logits, likelihood="categorical")
    with pytest.warns(UserWarning, match="independent MAP fits"):
        model.compile(optimizer="adam")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.compile(optimizer=bk.optimizers.IndependentParticles())


def test_clone_model_keeps_the_likelihood():
    """keras.models.clone_model builds the clone from inputs and outputs, then compiles it from the compile
    config: a compiled model's likelihood and temperature travel there."""
    inputs, logits = _classifier()
    model = bk.BayesianModel(inputs, logits, likelihood="categorical", temperature=0.5)
    model.compile(optimizer=bk.optimizers.SVGD(1e-2))
    clone = keras.models.clone_model(model)
    assert isinstance(clone, bk.BayesianModel)
    assert isinstance(clone.likelihood, bk.likelihoods.Categorical) and clone.temperature == 0.5
    assert clone.num_particles == 3 and isinstance(clone.optimizer, bk.optimizers.SVGD)


def test_bayesian_model_from_a_sequential():
    seq = keras.Sequential(
        [
            keras.Input((4,)),
            bk.layers.Dense(8, activation="relu", num_particles=3),
            bk.layers.Dense(3),
        ]
    )
    model = bk.BayesianModel(seq, likelihood="categorical")
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_array_equal(model.predict_particles(x), seq.predict(x, verbose=0))
    model.compile(optimizer=bk.optimizers.SVGD())
    model.fit(x, np.arange(5) % 3, verbose=0)
    with pytest.raises(ValueError, match="no defined input"):
        bk.BayesianModel(
            keras.Sequential([bk.layers.Dense(3, num_particles=2)]), likelihood="categorical"
        )


@pytest.mark.parametrize("likelihood", ["normal", "categorical"])
def test_a_later_fit_on_targets_of_another_shape_is_refused(likelihood):
    """Keras retraces the step with relaxed shapes when the data's shape changes between fits; the
    likelihood's shape check then runs on the values instead of being skipped (it used to train silently
    on (n, 2) targets for one output, or crash while writing its message)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) if likelihood == "categorical" else x[:, 0]
    model = bk.zoo.mlp(
        3, 2 if likelihood == "categorical" else 1, (4,), num_particles=2, likelihood=likelihood
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, y, epochs=1, verbose=0)
    with pytest.raises(Exception, match="likelihood expects"):
        model.fit(x, np.stack([y, y, y], 1), epochs=1, verbose=0)
    model.fit(x, y[:, None], epochs=1, verbose=0)  # (n, 1) is still fine after the retrace
