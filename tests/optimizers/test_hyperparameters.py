"""Hyper-parameters are finite numbers where they must be, at construction AND when loaded from a
config (a saved NaN / inf is refused on load as on construction)."""

import keras
import pytest

import bayes_keras as bk
from targets import paper_mgvbp


def _model():
    inputs = keras.Input((3,))
    return bk.BayesianModel(
        inputs, bk.layers.Dense(2, num_particles=2)(inputs), likelihood="categorical"
    )


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_temperature_must_be_finite_and_positive(bad):
    inputs = keras.Input((3,))
    outputs = bk.layers.Dense(2, num_particles=2)(inputs)
    with pytest.raises(ValueError, match="temperature must be a finite positive number"):
        bk.BayesianModel(inputs, outputs, likelihood="categorical", temperature=bad)
    with pytest.raises(ValueError, match="temperature must be a finite positive number"):
        _model().compile(optimizer=bk.optimizers.IndependentParticles(), temperature=bad)
    config = _model().get_config()
    config["temperature"] = bad
    with pytest.raises(ValueError, match="temperature must be a finite positive number"):
        bk.BayesianModel.from_config(config)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -2.0])
def test_prior_parameters_must_be_finite(bad):
    with pytest.raises(ValueError, match="Normal prior scale"):
        bk.priors.Normal(scale=bad)
    with pytest.raises(ValueError, match="Normal prior scale"):
        bk.priors.Normal.from_config({"loc": 0.0, "scale": bad})
    if bad != -2.0:  # a negative mean is fine
        with pytest.raises(ValueError, match="Normal prior loc"):
            bk.priors.Normal.from_config({"loc": bad, "scale": 1.0})


@pytest.mark.parametrize(
    "make",
    [
        lambda lr: bk.optimizers.GaussianParticleFlow(lr),
        lambda lr: bk.optimizers.IndependentParticles(lr),
        lambda lr: bk.optimizers.SVGD(lr),
        lambda lr: bk.optimizers.MeanFieldVI(lr),
        lambda lr: paper_mgvbp(lr),
        lambda lr: paper_mgvbp(1e-2, mean_learning_rate=lr),
    ],
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e-3])
def test_learning_rates_must_be_finite_and_non_negative(make, bad):
    with pytest.raises(ValueError, match="learning_rate"):
        make(bad)
    good = make(1e-2)
    config = good.get_config()
    key = "mean_learning_rate" if config.get("mean_learning_rate") == 1e-2 else "learning_rate"
    config[key] = bad
    with pytest.raises(ValueError, match="learning_rate"):
        type(good).from_config(config)
