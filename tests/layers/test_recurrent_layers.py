"""Particle RNN layers (SimpleRNN, LSTM, GRU, Bidirectional) against keras.layers with copied weights."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from targets import keras_round_trip

N, B, T, F = 3, 4, 5, 3

# (our class, keras class, extra constructor kwargs)
_CELLS = {
    "simple_rnn": (bk.layers.SimpleRNN, keras.layers.SimpleRNN, {}),
    "lstm": (bk.layers.LSTM, keras.layers.LSTM, {}),
    "gru": (bk.layers.GRU, keras.layers.GRU, {"reset_after": True}),
    "gru_reset_before": (bk.layers.GRU, keras.layers.GRU, {"reset_after": False}),
}


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _keras_twin(keras_cls, weights, units, **kwargs):
    """A keras.layers RNN with the given (per-particle or shared) weights copied in."""
    ref = keras_cls(units, **kwargs)
    ref.build((None, T, weights[0].shape[0]))
    ref.set_weights(weights)
    return ref


def _assert_particles_match_keras(layer, keras_cls, y, x_per_particle, **kwargs):
    """y[:, n] == keras layer with particle n's weights applied to x_per_particle(n)."""
    ws = [v.numpy() for v in layer.weights]
    for n in range(N):
        per = ws if layer.deterministic else [w[n] for w in ws]
        ref = _keras_twin(keras_cls, per, layer.units, **kwargs)
        np.testing.assert_allclose(y[:, n], ref(x_per_particle(n)).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("cell", list(_CELLS))
def test_every_particle_equals_keras(cell, return_sequences, go_backwards):
    cls, keras_cls, extra = _CELLS[cell]
    kw = dict(return_sequences=return_sequences, go_backwards=go_backwards, **extra)
    x = _data(B, T, F)
    xp = _data(B, N, T, F, seed=1)
    gates = {"simple_rnn": 1, "lstm": 4}.get(cell, 3)

    # the layer where the particle axis begins: (batch, T, F) -> (batch, N, [T,] units)
    first = cls(4, num_particles=N, **kw)
    y = first(x).numpy()
    assert y.shape == ((B, N, T, 4) if return_sequences else (B, N, 4))
    assert tuple(first.compute_output_shape((None, T, F))) == (None,) + y.shape[1:]
    assert first.kernel.shape == (N, F, gates * 4) and first.recurrent_kernel.shape == (
        N,
        4,
        gates * 4,
    )
    assert first.bias.shape == ((N, 2, 12) if extra.get("reset_after") else (N, gates * 4))
    assert all(getattr(v, "is_particle_variable", False) for v in first.weights)
    assert not np.allclose(
        first.kernel.numpy()[0], first.kernel.numpy()[1]
    )  # independent initialisation
    assert not np.allclose(first.recurrent_kernel.numpy()[0], first.recurrent_kernel.numpy()[1])
    assert not np.allclose(y[:, 0], y[:, 1])
    _assert_particles_match_keras(first, keras_cls, y, lambda n: x, **kw)

    # a later layer: (batch, N, T, F), particle n reads its own slice
    later = cls(2, **kw)
    yp = later(xp).numpy()
    assert later.num_particles == N and later.kernel.shape == (N, F, gates * 2)
    _assert_particles_match_keras(later, keras_cls, yp, lambda n: xp[:, n], **kw)

    # deterministic (shared weights), both as first layer and on a particle input
    det_first = cls(4, num_particles=N, deterministic=True, **kw)
    yd = det_first(x).numpy()
    assert det_first.kernel.shape == (F, gates * 4) and yd.shape == y.shape
    assert det_first.particle_variables == []
    _assert_particles_match_keras(det_first, keras_cls, yd, lambda n: x, **kw)
    det_later = cls(2, deterministic=True, **kw)
    ydp = det_later(xp).numpy()
    assert ydp.shape == yp.shape
    _assert_particles_match_keras(det_later, keras_cls, ydp, lambda n: xp[:, n], **kw)


@pytest.mark.parametrize("cell", ["lstm", "gru_reset_before"])
def test_unrolled_no_bias_and_custom_activations_equal_keras(cell):
    cls, keras_cls, extra = _CELLS[cell]
    kw = dict(
        return_sequences=True,
        unroll=True,
        use_bias=False,
        activation="relu",
        recurrent_activation="hard_sigmoid",
        **extra,
    )
    xp = _data(B, N, T, F, seed=2)
    layer = cls(3, **kw)
    y = layer(xp).numpy()
    assert layer.bias is None and len(layer.weights) == 2
    _assert_particles_match_keras(layer, keras_cls, y, lambda n: xp[:, n], **kw)
    # the unrolled loop and the graph loop agree
    rolled = cls.from_config({**layer.get_config(), "unroll": False})
    rolled.build(xp.shape)
    rolled.set_weights(layer.get_weights())
    np.testing.assert_allclose(rolled(xp).numpy(), y, rtol=1e-6, atol=1e-6)


def test_simple_rnn_unrolled_equals_keras():
    kw = dict(return_sequences=False, unroll=True, go_backwards=True)
    x = _data(B, T, F, seed=3)
    layer = bk.layers.SimpleRNN(4, num_particles=N, **kw)
    _assert_particles_match_keras(
        layer, keras.layers.SimpleRNN, layer(x).numpy(), lambda n: x, **kw
    )


@pytest.mark.parametrize(
    "cell,merge_mode,return_sequences,first",
    [
        ("gru", "concat", True, True),
        ("lstm", "sum", False, False),
        ("simple_rnn", "ave", True, False),
        ("gru_reset_before", "mul", False, True),
    ],
)
def test_bidirectional_equals_keras(cell, merge_mode, return_sequences, first):
    cls, keras_cls, extra = _CELLS[cell]
    x = _data(B, T, F, seed=4) if first else _data(B, N, T, F, seed=5)
    layer = bk.layers.Bidirectional(
        cls(4, num_particles=N if first else None, return_sequences=return_sequences, **extra),
        merge_mode=merge_mode,
    )
    y = layer(x).numpy()
    width = 8 if merge_mode == "concat" else 4
    assert y.shape == ((B, N, T, width) if return_sequences else (B, N, width))
    assert tuple(layer.compute_output_shape(x.shape)) == y.shape
    assert layer.forward_layer.go_backwards is False and layer.backward_layer.go_backwards is True
    fw = [v.numpy() for v in layer.forward_layer.weights]
    bw = [v.numpy() for v in layer.backward_layer.weights]
    assert not np.allclose(fw[0], bw[0])
    for n in range(N):
        ref = keras.layers.Bidirectional(
            keras_cls(4, return_sequences=return_sequences, **extra), merge_mode=merge_mode
        )
        ref.build((None, T, F))
        ref.set_weights([w[n] for w in fw] + [w[n] for w in bw])
        xn = x if first else x[:, n]
        np.testing.assert_allclose(y[:, n], ref(xn).numpy(), rtol=1e-5, atol=1e-5)


def test_gradients_reach_every_particle_variable_and_stay_per_particle():
    x = _data(B, T, F, seed=6)
    first = bk.layers.GRU(4, num_particles=N, return_sequences=True)
    second = bk.layers.Bidirectional(bk.layers.LSTM(3, return_sequences=True))
    third = bk.layers.SimpleRNN(2, go_backwards=True)
    with tf.GradientTape(persistent=True) as tape:
        y = third(second(first(x)))
        all_out = tf.reduce_sum(y**2)
        particle0 = tf.reduce_sum(y[:, 0] ** 2)
    variables = first.weights + second.weights + third.weights
    assert len(variables) == 12 and all(
        getattr(v, "is_particle_variable", False) for v in variables
    )
    for v, g_all, g0 in zip(
        variables, tape.gradient(all_out, variables), tape.gradient(particle0, variables)
    ):
        g_all, g0 = g_all.numpy(), g0.numpy()
        for n in range(N):
            assert np.abs(g_all[n]).max() > 0, (v.path, n)
        assert np.abs(g0[0]).max() > 0, v.path
        np.testing.assert_array_equal(g0[1:], 0.0, err_msg=v.path)


def test_log_prior_counts_recurrent_kernel_with_its_prior():
    layer = bk.layers.GRU(
        3, num_particles=4, reset_after=True, kernel_prior=2.0, recurrent_prior=0.5, bias_prior=1.5
    )
    layer.build((None, T, F))

    def lp(w, s):
        return np.sum(
            -0.5 * (w / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi), axis=tuple(range(1, w.ndim))
        )

    k, u, b = layer.kernel.numpy(), layer.recurrent_kernel.numpy(), layer.bias.numpy()
    np.testing.assert_allclose(
        layer.log_prior().numpy(), lp(k, 2.0) + lp(u, 0.5) + lp(b, 1.5), rtol=1e-5
    )
    # default: the recurrent kernel uses the kernel prior
    default = bk.layers.LSTM(3, num_particles=2, kernel_prior=0.3)
    assert default.recurrent_prior.scale == 0.3
    # a model sees the priors of every RNN, also those inside Bidirectional
    inputs = keras.Input((T, F))
    h = bk.layers.Bidirectional(bk.layers.GRU(3, num_particles=2, kernel_prior=2.0))(inputs)
    model = bk.BayesianModel(inputs, bk.layers.Dense(2)(h), likelihood="categorical")
    assert len(model.particle_layers) == 3 and len(model.particle_variables) == 8
    scales = [
        2.0 if "gru" in v.path and "kernel" in v.path else 1.0 for v in model.particle_variables
    ]
    assert scales.count(2.0) == 4
    ref = sum(lp(v.numpy(), s) for v, s in zip(model.particle_variables, scales))
    np.testing.assert_allclose(model.log_prior()[0].numpy(), ref, rtol=1e-5)


def test_lstm_unit_forget_bias_and_orthogonal_recurrent_kernels():
    det = bk.layers.LSTM(3, num_particles=2, deterministic=True)
    det.build((None, T, F))
    np.testing.assert_array_equal(
        det.bias.numpy(), np.r_[np.zeros(3), np.ones(3), np.zeros(6)]
    )  # as Keras
    part = bk.layers.LSTM(3, num_particles=5)
    part.build((None, T, F))
    b = part.bias.numpy()
    assert (
        np.all(np.abs(b[:, 3:6] - 1.0) < 0.1)
        and np.all(np.abs(b[:, :3]) < 0.1)
        and np.all(np.abs(b[:, 6:]) < 0.1)
    )
    assert b[:, 3:6].std(0).min() > 0  # the particles still differ on the forget block
    no = bk.layers.LSTM(3, num_particles=2, unit_forget_bias=False, bias_initializer="zeros")
    no.build((None, T, F))
    np.testing.assert_array_equal(no.bias.numpy(), 0.0)
    for n in range(5):  # (units, 4 units) orthogonal per particle: orthonormal rows
        u = part.recurrent_kernel.numpy()[n]
        np.testing.assert_allclose(u @ u.T, np.eye(3), atol=1e-5)


def test_configs_round_trip():
    layers = [
        bk.layers.SimpleRNN(
            3, activation="relu", num_particles=2, go_backwards=True, kernel_prior=0.5
        ),
        bk.layers.LSTM(
            4,
            return_sequences=True,
            unit_forget_bias=False,
            recurrent_prior=bk.priors.Normal(0.1, "he"),
        ),
        bk.layers.GRU(
            2,
            reset_after=False,
            deterministic=True,
            unroll=True,
            recurrent_activation="hard_sigmoid",
        ),
        bk.layers.Bidirectional(
            bk.layers.GRU(3, num_particles=2, return_sequences=True, name="enc"), merge_mode="ave"
        ),
    ]
    for layer in layers:
        clone = layer.__class__.from_config(layer.get_config())
        assert clone.get_config() == layer.get_config()
    clone = keras_round_trip(layers[1], None)
    assert (
        clone.recurrent_prior.scale == "he"
        and clone.recurrent_prior.loc == 0.1
        and clone.unit_forget_bias is False
    )
    bi = keras_round_trip(layers[3], None)
    assert (
        bi.merge_mode == "ave"
        and bi.forward_layer.name == "forward_enc"
        and bi.backward_layer.go_backwards
    )
    assert bi.backward_layer.name == "backward_enc" and bi.forward_layer.num_particles == 2


def test_gru_classifier_fits_digits_and_survives_saving(tmp_path):
    (xtr, ytr), (xte, _) = bk.datasets.load_digits()
    xtr, ytr = xtr[:384], ytr[:384]
    model = bk.zoo.gru_classifier(3, units=16, num_classes=10)
    assert model.num_particles == 3 and model.output_shape == (None, 3, 10)
    model.compile(optimizer=bk.optimizers.IndependentParticles(1e-2), metrics=["accuracy"])
    hist = model.fit(xtr, ytr, batch_size=64, epochs=2, verbose=0)
    assert (
        hist.history["loss"][1] < hist.history["loss"][0]
        and hist.history["nll"][1] < hist.history["nll"][0]
    )
    loaded = keras_round_trip(model, tmp_path, "gru")
    assert isinstance(loaded.get_layer("gru"), bk.layers.GRU) and loaded.num_particles == 3
    assert all(getattr(v, "is_particle_variable", False) for v in loaded.get_layer("gru").weights)
    np.testing.assert_array_equal(
        loaded.predict(xte[:64], verbose=0), model.predict(xte[:64], verbose=0)
    )


def test_bidirectional_model_trains_with_gpf_and_survives_saving(tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((96, T, F)).astype(np.float32)
    y = (x[:, 0, 0] > x[:, -1, 0]).astype(np.int32)  # needs both ends of the sequence
    inputs = keras.Input((T, F))
    h = bk.layers.Bidirectional(bk.layers.LSTM(4, num_particles=N, return_sequences=True))(inputs)
    h = bk.layers.GRU(4, deterministic=True)(h)  # a shared (MAP) layer in between
    model = bk.BayesianModel(inputs, bk.layers.Dense(2)(h), likelihood="categorical")
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2, structure="layer"))
    before = [v.numpy().copy() for v in model.trainable_variables]
    hist = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    assert np.all(np.isfinite(hist.history["loss"]))
    assert all(not np.allclose(b, v.numpy()) for b, v in zip(before, model.trainable_variables))
    loaded = keras_round_trip(model, tmp_path, "bi")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_bad_inputs_and_arguments_are_reported():
    with pytest.raises(ValueError, match="rank 3"):
        bk.layers.GRU(3, num_particles=2)(_data(B, F))  # 2-D input
    with pytest.raises(ValueError, match="pass num_particles"):
        bk.layers.LSTM(3)(_data(B, T, F))  # a later layer fed an input without the particle axis
    with pytest.raises(ValueError, match="given num_particles"):
        bk.layers.SimpleRNN(3, num_particles=2)(_data(B, N, T, F))
    built = bk.layers.GRU(3)
    built(_data(B, N, T, F))
    with pytest.raises(ValueError, match=r"expects input \(batch, particles, time, features\)"):
        built(_data(B, T, F))
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\); got 1.0"):
        bk.layers.GRU(3, dropout=1.0)
    with pytest.raises(ValueError, match="recurrent_dropout must be a number"):
        bk.layers.LSTM(3, recurrent_dropout=-0.1)
    with pytest.raises(ValueError, match="stateful"):
        bk.layers.LSTM(3, stateful=True)
    with pytest.raises(ValueError, match="return_state"):
        bk.layers.SimpleRNN(3, return_state=True)
    bk.layers.LSTM(
        3, dropout=0.0, kernel_regularizer=None, use_cudnn="auto"
    )  # Keras' defaults are accepted
    with pytest.raises(ValueError, match="units"):
        bk.layers.LSTM(0)
    with pytest.raises(ValueError, match="particle RNN"):
        bk.layers.Bidirectional(keras.layers.GRU(3))
    with pytest.raises(ValueError, match="merge_mode"):
        bk.layers.Bidirectional(bk.layers.GRU(3), merge_mode=None)
    with pytest.raises(ValueError, match="go_backwards"):
        bk.layers.Bidirectional(bk.layers.GRU(3, go_backwards=True))
    with pytest.raises(ValueError, match="return_sequences"):
        bk.layers.Bidirectional(
            bk.layers.GRU(3),
            backward_layer=bk.layers.GRU(3, go_backwards=True, return_sequences=True),
        )
    with pytest.raises(ValueError, match="Unknown GRU classifier layer"):
        bk.zoo.gru_classifier(2, deterministic_layers=("conv1",))


def test_particle_layers_follow_the_weight_order_inside_bidirectional():
    """Keras lists a Bidirectional's inner layers in reverse; the model's particle order must not be."""
    inputs = keras.Input((5, 3))
    h = bk.layers.Bidirectional(bk.layers.GRU(4, num_particles=2))(inputs)
    model = bk.BayesianModel(inputs, bk.layers.Dense(2)(h), likelihood="categorical")
    position = {id(v): i for i, v in enumerate(model.weights)}
    order = [position[id(v)] for layer in model.particle_layers for v in layer.weights]
    assert order == sorted(order)
    names = [layer.name for layer in model.particle_layers]
    assert names.index(next(n for n in names if n.startswith("forward"))) < names.index(
        next(n for n in names if n.startswith("backward"))
    )


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _reference_rnn(cell, weights, x, input_keep, recurrent_keep, reset_after=True):
    """A plain numpy loop of one particle's cell over (B, T, F) with fixed dropout masks: the inputs are
    multiplied by input_keep (B, F) at every step, h_(t-1) by recurrent_keep (B, units) wherever it enters
    a recurrent matmul, the carried state never. Returns all states (B, T, units)."""
    kernel, recurrent, bias = weights
    units = recurrent.shape[0]
    h = np.zeros((x.shape[0], units), np.float64)
    c = np.zeros_like(h)
    out = []
    for t in range(x.shape[1]):
        xw = (x[:, t] * input_keep) @ kernel
        h_in = h * recurrent_keep
        if cell == "simple_rnn":
            h = np.tanh(xw + bias + h_in @ recurrent)
        elif cell == "lstm":
            i, f, g, o = np.split(xw + bias + h_in @ recurrent, 4, axis=-1)
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            h = _sigmoid(o) * np.tanh(c)
        else:
            a_z, a_r, a_h = np.split(xw + (bias[0] if reset_after else bias), 3, axis=-1)
            if reset_after:
                g_z, g_r, g_h = np.split(h_in @ recurrent + bias[1], 3, axis=-1)
                r = _sigmoid(a_r + g_r)
                hh = np.tanh(a_h + r * g_h)
            else:
                g_z, g_r = np.split(h_in @ recurrent[:, : 2 * units], 2, axis=-1)
                r = _sigmoid(a_r + g_r)
                hh = np.tanh(a_h + (r * h_in) @ recurrent[:, 2 * units :])
            z = _sigmoid(a_z + g_z)
            h = z * h + (1 - z) * hh
        out.append(h)
    return np.stack(out, 1)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("cell", list(_CELLS))
def test_dropout_equals_a_per_particle_loop_with_the_same_masks(cell, first, deterministic):
    cls, _, extra = _CELLS[cell]
    layer = cls(
        4,
        num_particles=N if first else None,
        dropout=0.3,
        recurrent_dropout=0.4,
        seed=3,
        return_sequences=True,
        deterministic=deterministic,
        **extra,
    )
    x = _data(B, T, F) if first else _data(B, N, T, F, seed=1)
    layer.build(x.shape)
    no_dropout = layer(x, training=False).numpy()
    state = layer.seed_generator.state.numpy()
    y = layer(x, training=True).numpy()
    layer.seed_generator.state.assign(state)
    input_keep, recurrent_keep = (m.numpy() for m in layer._dropout_masks(tf.constant(x), True))
    for keep, rate in ((input_keep, 0.3), (recurrent_keep, 0.4)):
        assert keep.shape[:2] == (B, N)
        assert set(np.unique(keep)) == {0.0, np.float32(1 / (1 - rate))}
        assert not np.array_equal(keep[:, 0], keep[:, 1])  # particles draw their own masks
    ws = [v.numpy().astype(np.float64) for v in layer.weights if getattr(v, "trainable", True)]
    for n in range(N):
        per = ws if deterministic else [w[n] for w in ws]
        xn = x if first else x[:, n]
        reference = _reference_rnn(
            cell,
            per,
            xn,
            input_keep[:, n],
            recurrent_keep[:, n],
            reset_after=extra.get("reset_after", True),
        )
        np.testing.assert_allclose(y[:, n], reference, rtol=1e-4, atol=1e-5)
        no_drop = _reference_rnn(
            cell, per, xn, 1.0, 1.0, reset_after=extra.get("reset_after", True)
        )
        np.testing.assert_allclose(
            no_dropout[:, n], no_drop, rtol=1e-4, atol=1e-5
        )  # inference: no dropout
    assert not np.allclose(y, no_dropout)


@pytest.mark.parametrize("optimizer", ["gpf", "matrix_svgd"])
def test_recurrent_dropout_model_trains_and_predicts_deterministically(optimizer, tmp_path):
    x, y = _data(32, T, F, seed=4), np.arange(32) % 3
    inputs = keras.Input((T, F))
    h = bk.layers.GRU(
        8, num_particles=N, dropout=0.2, recurrent_dropout=0.2, seed=0, return_sequences=True
    )(inputs)
    h = bk.layers.LSTM(8, dropout=0.2, recurrent_dropout=0.2, seed=1)(h)
    model = bk.BayesianModel(inputs, bk.layers.Dense(3)(h), likelihood="categorical")
    opt = (
        bk.optimizers.GaussianParticleFlow(1e-2)
        if optimizer == "gpf"
        else bk.optimizers.MatrixSVGD(1e-2)
    )  # KFAC capture records the dropped-out inputs
    model.compile(optimizer=opt)
    loss = model.fit(x, y, epochs=8, batch_size=16, verbose=0).history["loss"]
    assert np.all(np.isfinite(loss)) and loss[-1] < loss[0]
    np.testing.assert_array_equal(model.predict(x, verbose=0), model.predict(x, verbose=0))
    loaded = keras_round_trip(model, tmp_path)
    assert loaded.layers[1].dropout == 0.2 and loaded.layers[2].recurrent_dropout == 0.2
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6
    )
