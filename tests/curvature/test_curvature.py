"""bayes_keras.curvature: captured layer statistics against brute-force per-example gradients."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from targets import paper_mgvbp


class _Recording(bk.optimizers.IndependentParticles):
    """Asks for curvature and keeps, eagerly, the per-example squared gradients it is handed."""

    curvature_request = bk.curvature.CurvatureRequest("squared_gradients")

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        super().update_particles(grads, learning_rate, iteration, step, writes)
        self.seen = {}
        for r in step.curvature:
            self.scale = float(r.dataset_scale)
            for variable, squares in bk.curvature.per_example_squared_gradients(r):
                self.seen[variable.path] = squares.numpy()


def _brute_force(model, x, y):
    """sum_b (d -log p(y_b | x_b, w_n) / d w_n)^2 by one backward pass per example."""
    pvars = model.particle_variables
    total = {v.path: np.zeros(v.shape, np.float64) for v in pvars}
    for b in range(len(x)):
        with tf.GradientTape() as tape:
            out = model(x[b : b + 1], training=True)
            loss = -tf.reduce_sum(
                model.likelihood.log_prob(y[b : b + 1], out)
            )  # sum over particles
        for v, g in zip(pvars, tape.gradient(loss, pvars)):
            total[v.path] += np.square(g.numpy().astype(np.float64))
    return total


def _conv_net(n):
    inputs = keras.Input((6, 6, 2))
    h = bk.layers.Conv2D(3, 3, padding="same", activation="relu", num_particles=n, name="c1")(
        inputs
    )
    h = bk.layers.Conv2D(4, 3, strides=2, padding="valid", activation="tanh", name="c2")(h)
    h = bk.layers.Flatten()(h)
    h = bk.layers.Dense(5, activation="relu", name="d1")(h)
    out = bk.layers.Dense(3, name="d2")(h)
    return bk.BayesianModel(inputs, out, likelihood="categorical")


def _conv1d_net(n):
    inputs = keras.Input((9, 2))
    h = bk.layers.Conv1D(
        3, 3, padding="causal", dilation_rate=2, activation="relu", num_particles=n, name="c1"
    )(inputs)
    h = bk.layers.Conv1D(4, 2, strides=2, padding="same", activation="tanh", name="c2")(h)
    h = bk.layers.Flatten()(h)
    return bk.BayesianModel(inputs, bk.layers.Dense(3, name="d")(h), likelihood="categorical")


def _dense_net(n):
    inputs = keras.Input((4,))
    h = bk.layers.Dense(6, activation="tanh", num_particles=n, name="d1")(inputs)
    out = bk.layers.Dense(2, name="d2")(h)
    return bk.BayesianModel(inputs, out, likelihood=bk.likelihoods.Normal(scale=0.7))


@pytest.mark.parametrize(
    "build", [_dense_net, _conv_net, _conv1d_net], ids=["dense", "conv", "conv1d"]
)
def test_per_example_squared_gradients_match_brute_force(build):
    rng = np.random.default_rng(0)
    model = build(3)
    shape = model.inputs[0].shape[1:]
    x = rng.standard_normal((7,) + tuple(shape)).astype(np.float32)
    if model.likelihood.__class__.__name__ == "Categorical":
        y = rng.integers(0, 3, 7)
    else:
        y = rng.standard_normal((7, 2)).astype(np.float32)
    opt = _Recording(1e-3)
    model.compile(optimizer=opt, dataset_size=70, temperature=0.5, run_eagerly=True)
    expected = _brute_force(model, x, y)  # before the step moves the weights
    model.train_on_batch(x, y)
    assert opt.scale == pytest.approx(70 / (7 * 0.5))
    assert set(opt.seen) == set(expected)
    for path, value in expected.items():
        np.testing.assert_allclose(
            opt.seen[path], value, rtol=2e-4, atol=1e-7 * value.max(), err_msg=path
        )


def test_capture_is_off_unless_asked():
    model = _dense_net(2)
    with bk.curvature.capturing() as records:
        model(np.zeros((3, 4), np.float32))
    assert [r.layer.name for r in records] == ["d1", "d2"]
    bk.curvature.record(model.layers[1], None, None)  # outside the context: a no-op
    assert len(records) == 2


def test_curvature_follows_the_class_not_its_name():
    """A subclass of a particle layer gets its parent's curvature formulas (dispatch by class, not name)."""

    class RenamedDense(bk.layers.Dense):
        pass

    x = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    inputs = keras.Input((4,))
    h = RenamedDense(5, activation="tanh", num_particles=3)(inputs)
    model = bk.BayesianModel(inputs, RenamedDense(2)(h), likelihood="categorical")
    assert bk.curvature.kinds.layer_kind(model.layers[1]) == "Dense"
    model.compile(optimizer=paper_mgvbp(1e-2, curvature="empirical_fisher"))
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    assert (
        np.isfinite(history.history["loss"]).all()
        and int(model.optimizer.skipped_updates.numpy()) == 0
    )


def test_a_layer_class_declares_its_curvature():
    """Curvature support is what the class declares (`curvature_rules`): a Dense subclass that declares
    none is refused by KFAC and by the squared-gradient path with the layer named, and a Conv1D (no
    rules yet) is refused likewise; requests are validated."""

    class NoCurvatureDense(bk.layers.Dense):
        curvature_rules = None

    inputs = keras.Input((4,))
    h = bk.layers.Dense(5, activation="tanh", num_particles=3)(inputs)
    model = bk.BayesianModel(
        inputs, NoCurvatureDense(2, name="plain_head")(h), likelihood="categorical"
    )
    x = np.zeros((8, 4), np.float32)
    y = np.zeros((8,), np.int32)
    model.compile(optimizer=bk.optimizers.MatrixSVGD())
    with pytest.raises(ValueError, match="KFAC supports the particle layers.*'plain_head'"):
        model.fit(x, y, epochs=1, verbose=0)
    assert bk.curvature.layer_curvature(model.layers[1]) is bk.curvature.rules.DENSE
    assert bk.curvature.layer_curvature(model.layers[2]) is None
    assert bk.curvature.layer_curvature(bk.layers.Conv1D(2, 3)) is bk.curvature.rules.CONV1D
    assert bk.curvature.layer_curvature(bk.layers.LayerNormalization()) is None
    with pytest.raises(ValueError, match="statistics must be one of"):
        bk.curvature.CurvatureRequest("kfac")
    with pytest.raises(ValueError, match="labels must be one of"):
        bk.curvature.CurvatureRequest("squared_gradients", "true")


def test_embedding_squared_gradients_match_brute_force():
    rng = np.random.default_rng(1)
    tokens = keras.Input((4,), dtype="int32")
    h = bk.layers.Embedding(7, 3, num_particles=3, name="emb")(tokens)
    h = bk.layers.GlobalAveragePooling1D()(h)
    model = bk.BayesianModel(tokens, bk.layers.Dense(3, name="out")(h), likelihood="categorical")
    x, y = rng.integers(0, 7, (6, 4)).astype(np.int32), rng.integers(0, 3, 6)
    opt = _Recording(1e-3)
    model.compile(optimizer=opt, dataset_size=60, run_eagerly=True)
    expected = _brute_force(model, x, y)
    model.train_on_batch(x, y)
    assert set(opt.seen) == set(expected)
    for path, value in expected.items():
        np.testing.assert_allclose(
            opt.seen[path], value, rtol=2e-4, atol=1e-7 * value.max(), err_msg=path
        )


@pytest.mark.parametrize(
    "make",
    [
        lambda: bk.optimizers.MatrixSVGD(),
        lambda: bk.optimizers.PreconditionedParticles(),
        lambda: bk.optimizers.MGVBP(structure="kronecker", curvature="fisher"),
    ],
    ids=["MatrixSVGD", "PreconditionedParticles", "MGVBP-kronecker"],
)
def test_kfac_methods_train_a_conv1d_regressor_with_defaults(make):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 12, 2)).astype(np.float32)
    y = (
        np.sin(x[:, :, 0]).mean(1, keepdims=True) + 0.5 * x[:, -3:, 1].mean(1, keepdims=True)
    ).astype(np.float32)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 2))
    h = bk.layers.Conv1D(6, 3, padding="causal", activation="relu", num_particles=4)(inputs)
    h = bk.layers.Conv1D(6, 3, strides=2, activation="relu")(h)
    out = bk.layers.Dense(1)(bk.layers.GlobalAveragePooling1D()(h))
    model = bk.BayesianModel(inputs, out, likelihood=bk.likelihoods.Normal(scale=0.3))
    model.compile(optimizer=make())
    history = model.fit(x, y, epochs=15, batch_size=32, verbose=0).history["loss"]
    assert np.all(np.isfinite(history)) and history[-1] < 0.8 * history[0], history
