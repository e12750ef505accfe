"""The model-optimizer contract (BayesianOptimizer, StepInfo, ParticleView, the guarded update) for every
optimizer: subclassed models, custom training loops equal to fit, weights saved once, refused updates."""

import os
import zipfile

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from optimizer_registry import configured

OPTIMIZERS = configured(  # every method, and below the variants the contract is checked on too
    GaussianParticleFlow={"learning_rate": 1e-2},
    SVGD={"learning_rate": 1e-2},
    IndependentParticles={"learning_rate": 1e-2},
    MatrixSVGD=lambda: bk.optimizers.MatrixSVGD(0.1, bk.preconditioners.KFACPreconditioner()),
    PreconditionedParticles=lambda: bk.optimizers.PreconditionedParticles(
        0.01, bk.preconditioners.KFACPreconditioner(fisher="true")
    ),
    MeanFieldVI={"learning_rate": 1e-2, "seed": 1},
    MGVBP={"learning_rate": 1e-2, "seed": 1},
)
OPTIMIZERS |= {
    "gpf_layer": lambda: bk.optimizers.GaussianParticleFlow(1e-2, structure="layer"),
    "mgvbp_fisher": lambda: bk.optimizers.MGVBP(1e-2, curvature="fisher", seed=1),
    "mgvbp_full": lambda: bk.optimizers.MGVBP(1e-2, structure="full", seed=1),
    "mgvbp_kronecker": lambda: bk.optimizers.MGVBP(
        1e-2, structure="kronecker", curvature="empirical_fisher", seed=1
    ),
    "mgvbp_score": lambda: bk.optimizers.MGVBP(1e-3, estimator="score", seed=1),
}


def _data(n=48, d=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5).astype(np.int32)


def _seeded(seed):
    """Initializers with their own seeds: the same weights whenever (and in whichever model) they are built."""
    return {
        "kernel_initializer": keras.initializers.GlorotUniform(seed=seed),
        "bias_initializer": keras.initializers.RandomNormal(stddev=0.1, seed=seed + 100),
    }


def _functional(n=4, d=4, classes=3):
    inputs = keras.Input((d,))
    h = bk.layers.Dense(5, activation="tanh", num_particles=n, **_seeded(1))(inputs)
    return bk.BayesianModel(
        inputs, bk.layers.Dense(classes, **_seeded(2))(h), likelihood="categorical"
    )


class SubclassedNet(bk.BayesianModel):
    def __init__(self, n=4, classes=3, **kwargs):
        super().__init__(likelihood="categorical", **kwargs)
        self.hidden = bk.layers.Dense(5, activation="tanh", num_particles=n, **_seeded(1))
        self.head = bk.layers.Dense(classes, **_seeded(2))

    def call(self, x):
        return self.head(self.hidden(x))


@pytest.mark.parametrize("name", ["gpf_layer", "MGVBP", "MatrixSVGD"])
def test_subclassed_model_fits_without_a_prior_call(name):
    """A subclassed BayesianModel, compiled and fitted with no call before (and after a functional one was
    built in the same process), trains exactly as the functional model of the same layers does."""
    x, y = _data()
    weights = []
    for make in (_functional, SubclassedNet):
        keras.utils.set_random_seed(0)
        model = make()
        model.compile(optimizer=OPTIMIZERS[name](), dataset_size=len(x))
        history = model.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
        assert np.isfinite(history.history["loss"]).all() and model.skipped_steps == 0
        assert model.optimizer.view.variables == model.particle_variables
        assert model.optimizer.view.layer_blocks == [
            [0, 1],
            [2, 3],
        ]  # the layers reached the optimizer
        weights.append([v.numpy() for v in model.weights if v.name != "label_seed"])
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_custom_loop_equals_fit_bit_for_bit(name):
    """The documented recipe, model.bayesian_gradients + optimizer.apply in a tf.function, gives exactly
    what fit gives."""
    x, y = _data()
    results = []
    for loop in ("fit", "custom"):
        keras.utils.set_random_seed(0)
        model = _functional()
        model.compile(optimizer=OPTIMIZERS[name](), dataset_size=len(x))
        if loop == "fit":
            model.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
        else:
            model.optimizer.build(model.trainable_variables)

            @tf.function
            def train(xb, yb):
                grads, step = model.bayesian_gradients(xb, yb)
                model.optimizer.apply(grads, model.trainable_variables, step)

            for _ in range(2):
                for i in range(0, len(x), 16):
                    train(x[i : i + 16], y[i : i + 16])
        results.append([v.numpy() for v in model.variables + model.optimizer.variables])
    assert int(model.optimizer.iterations.numpy()) == 6
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["GaussianParticleFlow", "MGVBP", "MeanFieldVI", "MatrixSVGD"])
def test_keras_file_holds_each_weight_once(name, tmp_path):
    x, y = _data()
    model = _functional()
    model.compile(optimizer=OPTIMIZERS[name]())
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    model_ids = {id(v) for v in model.variables}
    assert not any(id(v) in model_ids for v in model.optimizer.variables)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    with (
        zipfile.ZipFile(path) as archive,
        archive.open("model.weights.h5") as raw,
        h5py.File(raw) as f,
    ):
        stored = []
        f.visititems(
            lambda key, item: stored.append(key) if isinstance(item, h5py.Dataset) else None
        )
    assert sum(key.startswith("optimizer/") for key in stored) == len(model.optimizer.variables)
    # The optimizer's state is its own: zeroing it leaves the model's weights alone.
    weights = [v.numpy() for v in model.weights]
    for v in model.optimizer.variables:
        v.assign(tf.zeros_like(v))
    for w, v in zip(weights, model.weights):
        np.testing.assert_array_equal(w, v.numpy())


def _state(model):
    # KFAC's running curvature statistics are updated from the step's (finite) records before the guarded
    # update: they describe the data, not the posterior (docs/architecture.md).
    own = [
        v
        for v in model.optimizer.variables
        if v.name not in ("skipped_updates", "learning_rate", "skipped_curvature_steps")
        and not v.name.startswith("kfac_")
    ]
    return [v.numpy() for v in model.variables + own]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("fault", ["nan_learning_rate", "huge_gradient"])
def test_refused_update_leaves_everything_unchanged_with_a_warning(name, fault):
    x, y = _data()
    model = _functional()
    model.compile(optimizer=OPTIMIZERS[name](), dataset_size=len(x))
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    before = _state(model)
    weights = np.ones(len(x), np.float32)
    if fault == "nan_learning_rate":
        model.optimizer.learning_rate = float("nan")
    else:  # one example weighted 1e30: a finite loss and finite gradients of order 1e30
        weights[0] = 1e30
    with pytest.warns(RuntimeWarning, match="update\\(s\\) skipped"):
        model.fit(x[:16], y[:16], sample_weight=weights[:16], epochs=1, batch_size=16, verbose=0)
    assert int(model.optimizer.skipped_updates.numpy()) == 1 and model.skipped_steps == 0
    for a, b in zip(before, _state(model)):
        np.testing.assert_array_equal(a, b)


def test_a_method_written_against_the_contract_is_told_what_it_got_wrong():
    """update_particles with another signature is refused when the class is defined; one that returns
    its new values instead of assigning them, or assigns nothing, is refused at its first step (it
    would otherwise train nothing, silently); a step_rule or Keras argument the method cannot take
    names the method and the argument."""
    with pytest.raises(TypeError, match=r"update_particles must take \(self, grads, learning_rate"):

        class WrongSignature(bk.optimizers.BayesianOptimizer):
            def update_particles(self, grads, learning_rate):
                pass

    class Returns(bk.optimizers.BayesianOptimizer):
        def update_particles(self, grads, learning_rate, iteration, step, writes):
            return [v.value - learning_rate * g for g, v in zip(grads, self.view.variables)]

    class AssignsNothing(bk.optimizers.BayesianOptimizer):
        def update_particles(self, grads, learning_rate, iteration, step, writes):
            pass

    x = np.random.default_rng(0).standard_normal((16, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    for optimizer, told in (
        (Returns(), "returned a value"),
        (AssignsNothing(), "assigned nothing"),
    ):
        model = bk.zoo.mlp(4, 2, (8,), num_particles=2)
        model.compile(optimizer=optimizer, likelihood="categorical", dataset_size=16)
        with pytest.raises(TypeError, match=f"must assign the new values into `writes`.*{told}"):
            model.fit(x, y, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"SVGD step_rule: .*got 'adamw'"):
        bk.optimizers.SVGD(step_rule="adamw")
    with pytest.raises(ValueError, match=r"SVGD does not support use_ema=True: .*moving average"):
        bk.optimizers.SVGD(use_ema=True)
    with pytest.warns(UserWarning, match="element-wise step rule"):
        bk.optimizers.GaussianParticleFlow(step_rule="elementwise_adam")
