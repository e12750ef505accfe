"""Saved state that the library would never write is refused on load, naming the entry (#30): NaN particles
in the weights, Inf optimizer state, a non-positive MGVBP precision. The files are made by saving a trained
model and rewriting one entry of its model.weights.h5 (h5py, Keras' own weights format)."""

import os
import zipfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import h5py  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import bayes_keras as bk  # noqa: E402


def _trained(optimizer, tmp_path):
    x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    keras.utils.set_random_seed(0)
    model = bk.zoo.mlp(4, 2, (5,), num_particles=3, likelihood="categorical")
    model.compile(optimizer=optimizer)
    model.fit(x, y, epochs=1, verbose=0)
    path = str(tmp_path / "good.keras")
    model.save(path)
    return model, path


def _tampered(path, entry, change, tmp_path):
    """A copy of the .keras file with `change(array) -> array` applied to the weights entry `entry`."""
    out = str(tmp_path / "tampered.keras")
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(out, "w") as target:
        for item in source.namelist():
            data = source.read(item)
            if item == "model.weights.h5":
                scratch = tmp_path / "weights.h5"
                scratch.write_bytes(data)
                with h5py.File(scratch, "a") as f:
                    f[entry][...] = change(np.array(f[entry]))
                data = scratch.read_bytes()
            target.writestr(item, data)
    return out


def test_a_good_file_loads_and_a_tampered_one_is_refused_naming_the_entry(tmp_path):
    model, path = _trained(bk.optimizers.GaussianParticleFlow(), tmp_path)
    keras.models.load_model(path)  # the untouched file loads
    nan_weights = _tampered(
        path,
        "layers/dense/vars/0",
        lambda a: np.where(np.arange(a.size).reshape(a.shape) == 3, np.nan, a),
        tmp_path,
    )
    with pytest.raises(
        ValueError,
        match=r"layer 'dense_0' is invalid: entry 0 \(dense_0/kernel\) holds 1 NaN / Inf",
    ):
        keras.models.load_model(nan_weights)
    slot = next(
        i for i, v in enumerate(model.optimizer.variables) if v.shape.rank and "kernel" in v.path
    )
    inf_state = _tampered(
        path, f"optimizer/vars/{slot}", lambda a: np.full_like(a, np.inf), tmp_path
    )
    with pytest.raises(
        ValueError, match=rf"optimizer '.*' is invalid: entry {slot} .* holds \d+ NaN / Inf"
    ):
        keras.models.load_model(inf_state)


@pytest.mark.parametrize("structure", ["diagonal", "full"])
def test_a_non_positive_mgvbp_precision_is_refused(structure, tmp_path):
    model, path = _trained(bk.optimizers.MGVBP(structure=structure), tmp_path)
    keras.models.load_model(path)
    slot = next(
        i
        for i, v in enumerate(model.optimizer.variables)
        if v.path.endswith("_precision")
        and "m_precision" not in v.path
        and "v_precision" not in v.path
    )
    negative = _tampered(path, f"optimizer/vars/{slot}", lambda a: -np.abs(a), tmp_path)
    kind = "not positive" if structure == "diagonal" else "not symmetric positive definite"
    with pytest.raises(ValueError, match=rf"is invalid: .*precision.* {kind}"):
        keras.models.load_model(negative)


def _with_config(path, change, tmp_path, name="config.keras"):
    """A copy of the .keras file with `change(config dict)` applied to its config.json."""
    import json

    out = str(tmp_path / name)
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(out, "w") as target:
        for item in source.namelist():
            data = source.read(item)
            if item == "config.json":
                config = json.loads(data)
                change(config)
                data = json.dumps(config).encode()
            target.writestr(item, data)
    return out


def test_out_of_range_hyper_parameters_and_a_huge_input_in_the_config_are_refused(tmp_path):
    """The config of a .keras file goes through the same constructors as code: DimWiseRMSProp(rho=7) or
    epsilon=-1 in the optimizer's step rule are refused naming the argument; an Input changed to 10**9
    features is refused naming the layer whose saved weights expect 4 (Dense checks its inputs against the
    features it was built for, as keras.layers.Dense does; it loaded silently before)."""
    _, path = _trained(bk.optimizers.GaussianParticleFlow(step_rule="rmsprop"), tmp_path)

    def step_rule(config, key, value):
        config["compile_config"]["optimizer"]["config"]["step_rule"]["config"][key] = value

    for key, value in (("rho", 7.0), ("epsilon", -1.0)):
        bad = _with_config(path, lambda c: step_rule(c, key, value), tmp_path, f"{key}.keras")
        with pytest.raises(ValueError, match=key):
            keras.models.load_model(bad)

    def huge_input(config):
        for layer in config["config"]["layers"]:
            if layer["class_name"] == "InputLayer":
                layer["config"]["batch_shape"] = [None, 10**9]

    with pytest.raises(
        ValueError,
        match=r"layer 'dense_0' is incompatible .* expected axis -1 of input shape to have "
        r"value 4, but received input with shape \(None, 1000000000\)",
    ):
        keras.models.load_model(_with_config(path, huge_input, tmp_path))


def test_a_negative_second_moment_or_step_count_is_refused(tmp_path):
    """A negative RMSProp second moment in a saved GPF loaded silently, and then every step of fit was skipped
    (its square root is NaN); a negative step count loaded too. Both are refused naming the entry."""
    model, path = _trained(bk.optimizers.GaussianParticleFlow(step_rule="rmsprop"), tmp_path)
    slot = next(i for i, v in enumerate(model.optimizer.variables) if v.path.endswith("kernel_v"))
    negative = _tampered(path, f"optimizer/vars/{slot}", lambda a: -np.abs(a) - 1.0, tmp_path)
    with pytest.raises(
        ValueError,
        match=r"is invalid: .*kernel_v \(DimWiseRMSProp's second moment\) has \d+ negative",
    ):
        keras.models.load_model(negative)
    counter = next(
        i for i, v in enumerate(model.optimizer.variables) if v.path.endswith("iteration")
    )
    backwards = _tampered(
        path, f"optimizer/vars/{counter}", lambda a: np.full_like(a, -5), tmp_path
    )
    with pytest.raises(
        ValueError, match=r"is invalid: .*iteration \(a step count\) has 1 negative"
    ):
        keras.models.load_model(backwards)


@pytest.mark.parametrize(
    "likelihood, name, change, message",
    [
        (
            "normal",
            "likelihood_log_scale",
            lambda a: np.full_like(a, np.nan),
            r"likelihood_log_scale\) holds 1 NaN / Inf",
        ),
        (
            "normal",
            "likelihood_log_scale",
            lambda a: np.full_like(a, 200.0),
            r"log noise scale\) has 1 value\(s\) outside \[-50, 50\]",
        ),
        (
            "normal",
            "likelihood_target_scale",
            lambda a: np.full_like(a, -1.0),
            r"target scale\) has 1 value\(s\) that are not positive",
        ),
        (
            "normal",
            "likelihood_adapted",
            lambda a: np.full_like(a, 7.0),
            r"adapted flag\) has 1 value\(s\) outside \[0, 1\]",
        ),
        (
            "normal",
            "skipped_steps",
            lambda a: np.full_like(a, -5),
            r"skipped steps\) has 1 negative",
        ),
        (
            "heteroscedastic_normal",
            "likelihood_target_shift",
            lambda a: np.full_like(a, np.inf),
            r"likelihood_target_shift\) holds 1 NaN / Inf",
        ),
        (
            "heteroscedastic_normal",
            "likelihood_target_scale",
            lambda a: np.full_like(a, 0.0),
            r"target scale\) has 1 value\(s\) that are not positive",
        ),
        (
            "heteroscedastic_normal",
            "likelihood_adapted",
            lambda a: np.full_like(a, -1.0),
            r"adapted flag\) has 1 value\(s\) outside \[0, 1\]",
        ),
    ],
)
def test_invalid_regression_state_is_refused(likelihood, name, change, message, tmp_path):
    """The regression likelihoods' saved noise scale and target standardisation, and the skipped-step count, loaded
    silently when invalid (every predictive sd NaN or infinite, inverted intervals); refused naming the entry."""
    x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
    keras.utils.set_random_seed(0)
    model = bk.zoo.mlp(
        4,
        2 if likelihood == "heteroscedastic_normal" else 1,
        (5,),
        num_particles=3,
        likelihood=likelihood,
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, 2.0 * x[:, 0] + 1.0, epochs=1, verbose=0)
    path = str(tmp_path / "good.keras")
    model.save(path)
    keras.models.load_model(path)  # the untouched file loads
    own = (
        model._trainable_variables + model._non_trainable_variables
    )  # Keras' order of the model's own entries
    index = next(i for i, v in enumerate(own) if v.path.endswith(name))
    with pytest.raises(ValueError, match=message):
        keras.models.load_model(_tampered(path, f"vars/{index}", change, tmp_path))


@pytest.mark.parametrize("likelihood", ["categorical", "bernoulli"])
def test_classification_likelihoods_hold_no_state_to_tamper_with(likelihood):
    """Every likelihood's saved state is checked on load: the regression ones' above; the classification ones save
    nothing (their whole state is the particles', checked by the layers)."""
    model = bk.zoo.mlp(
        4, 3 if likelihood == "categorical" else 1, (5,), num_particles=2, likelihood=likelihood
    )
    assert model.likelihood.variables == []
    assert not [v for v in model.weights if v.path.startswith("likelihood")]


def test_a_negative_batch_norm_moving_variance_is_refused(tmp_path):
    """Its square root normalises every inference input: a negative one made every prediction NaN."""
    x = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = bk.layers.BatchNormalization(name="norm")(bk.layers.Dense(5, num_particles=3)(inputs))
    model = bk.BayesianModel(inputs, bk.layers.Dense(2)(hidden), likelihood="categorical")
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(x, (x[:, 0] > 0).astype("int32"), epochs=1, verbose=0)
    path = str(tmp_path / "good.keras")
    model.save(path)
    keras.models.load_model(path)
    layer = model.get_layer("norm")
    index = next(
        i
        for i, v in enumerate(layer._trainable_variables + layer._non_trainable_variables)
        if v.path.endswith("moving_variance")
    )
    with pytest.raises(
        ValueError,
        match=r"layer 'norm' is invalid: .*moving_variance \(moving variance\) has 1 "
        r"negative value\(s\)",
    ):
        keras.models.load_model(
            _tampered(
                path,
                f"layers/batch_normalization/vars/{index}",
                lambda a: np.where(np.arange(a.size).reshape(a.shape) == 2, -1.0, a),
                tmp_path,
            )
        )
