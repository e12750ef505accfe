"""KFAC (bayes_keras.curvature.kfac, bayes_keras.preconditioners.KFACPreconditioner) against ground truth.

Factors: every network is re-implemented here (numpy for the Dense net; TF with explicit per-layer /
per-time-step pre-activation tensors and hand-written im2col for the conv and recurrent nets) with the
layers' weights, and the per-example pre-activation gradients are taken from that re-implementation,
never from the capture mechanism. Expected factors (bayes_keras/curvature/kfac/):
    A = mean over the B*L rows of [a; 1][a; 1]^T,   G = dataset_scale * sum over the B*L rows of e e^T.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from targets import keras_round_trip
from bayes_keras.core.particle_optimizer import ParticleOptimizer
from bayes_keras.curvature import kfac_factors
from bayes_keras.curvature.preconditioners.kfac_preconditioner import damped_inverses

SIGMA = 0.7
DATASET, TEMPERATURE = 60, 0.5


class _Recorder(bk.optimizers.IndependentParticles):
    """Asks for KFAC statistics and keeps, eagerly, this step's batch factors per layer."""

    def __init__(self, fisher="empirical", **kwargs):
        super().__init__(1e-4, **kwargs)
        self.fisher = fisher

    @property
    def curvature_request(self):
        return bk.curvature.CurvatureRequest(
            "kronecker_factors", "sampled" if self.fisher == "true" else "observed"
        )

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        records = step.curvature
        self.records = records
        self.scale = float(records[0].dataset_scale)
        self.factors = {
            r.layer.name: {
                k: v.numpy().astype(np.float64) for k, v in kfac_factors(r, self.fisher).items()
            }
            for r in records
        }
        super().update_particles(grads, learning_rate, iteration, step, writes)


class _KFACNewton(ParticleOptimizer):
    """x <- x - lr * Q^{-1} g with a preconditioner's per-particle Q (records the batch factors eagerly)."""

    def __init__(self, preconditioner, learning_rate=1.0, **kwargs):
        super().__init__(learning_rate=learning_rate, step_rule="sgd", **kwargs)
        self.preconditioner = preconditioner
        self.batches = []

    @property
    def curvature_request(self):
        return self.preconditioner.curvature_request

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.preconditioner.build(self.view, self.add_variable)

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        self.records = step.curvature
        if tf.executing_eagerly():
            self.batches.append(
                [
                    {k: v.numpy().astype(np.float64) for k, v in kfac_factors(r).items()}
                    for r in step.curvature
                ]
            )
        particles = self.view.flatten([v.value for v in self.view.variables])
        flat = self.view.flatten(grads)
        self.last_curvature = self.preconditioner.update(particles, flat, step.curvature, iteration)
        self.step_particles(self.last_curvature.solve(flat), learning_rate, iteration, writes)


def _homogeneous(a):
    return np.concatenate([a, np.ones(a.shape[:-1] + (1,))], -1)


def _a_factor(rows, bias=True):
    """rows (R, p) -> mean of a~ a~^T."""
    rows = _homogeneous(rows) if bias else rows
    return rows.T @ rows / len(rows)


def _g_factor(rows, scale):
    return scale * rows.T @ rows


def _np(v):
    return np.asarray(v.numpy() if hasattr(v, "numpy") else v, np.float64)


def _assert_factors(got, expected, what):
    for name, value in expected.items():
        np.testing.assert_allclose(
            got[name], value, rtol=2e-4, atol=2e-5 * np.abs(value).max(), err_msg=f"{what} {name}"
        )


def _compile_and_step(model, x, y, opt):
    model.compile(optimizer=opt, dataset_size=DATASET, temperature=TEMPERATURE, run_eagerly=True)
    model.train_on_batch(x, y)
    assert opt.scale == pytest.approx(DATASET / (len(x) * TEMPERATURE))
    return opt.scale


# -- factors against re-implementations ------------------------------------------------------------
def test_dense_factors_match_a_numpy_forward_and_backward_pass():
    rng = np.random.default_rng(0)
    n, b = 3, 5
    inputs = keras.Input((3,))
    h = bk.layers.Dense(4, activation="tanh", num_particles=n, name="d1")(inputs)
    out = bk.layers.Dense(2, name="d2")(h)
    model = bk.BayesianModel(inputs, out, likelihood=bk.likelihoods.Normal(scale=SIGMA))
    x = rng.standard_normal((b, 3))
    y = rng.standard_normal((b, 2))
    w1, b1, w2, b2 = (_np(v) for v in model.particle_variables)
    opt = _Recorder()
    scale = _compile_and_step(model, x.astype(np.float32), y.astype(np.float32), opt)
    for p in range(n):
        hid = np.tanh(x @ w1[p] + b1[p])
        e2 = (hid @ w2[p] + b2[p] - y) / SIGMA**2  # d(-log p)/d z2 per example
        e1 = (e2 @ w2[p].T) * (1 - hid**2)
        _assert_factors(
            {k: v[p] for k, v in opt.factors["d1"].items()},
            {"A": _a_factor(x), "G": _g_factor(e1, scale)},
            f"d1[{p}]",
        )
        _assert_factors(
            {k: v[p] for k, v in opt.factors["d2"].items()},
            {"A": _a_factor(hid), "G": _g_factor(e2, scale)},
            f"d2[{p}]",
        )


def test_dense_kronecker_product_is_the_exact_fisher_of_one_example():
    """B = 1, one location: A (x) G = dataset_scale * g g^T, g the example's gradient of [kernel; bias]
    (row-major), taken by autodiff on the variables."""
    rng = np.random.default_rng(1)
    inputs = keras.Input((3,))
    h = bk.layers.Dense(4, activation="tanh", num_particles=2, name="d1")(inputs)
    out = bk.layers.Dense(3, name="d2")(h)
    model = bk.BayesianModel(inputs, out, likelihood="categorical")
    x, y = rng.standard_normal((1, 3)).astype(np.float32), np.array([2])
    with tf.GradientTape() as tape:
        loss = -tf.reduce_sum(model.likelihood.log_prob(y, model(x)))
    grads = tape.gradient(loss, model.particle_variables)
    opt = _Recorder()
    scale = _compile_and_step(model, x, y, opt)
    for layer, (gk, gb) in zip(["d1", "d2"], [grads[:2], grads[2:]]):
        for p in range(2):
            g = np.concatenate([_np(gk[p]), _np(gb[p])[None]], 0).ravel()  # vec_r([kernel; bias])
            fisher = scale * np.outer(g, g)
            kron = np.kron(opt.factors[layer]["A"][p], opt.factors[layer]["G"][p])
            np.testing.assert_allclose(kron, fisher, rtol=1e-4, atol=1e-6 * np.abs(fisher).max())


def _step_and_compare_patch_factors(model, x, y, expected):
    """One recorded step; each particle's factors against expected[p][layer] = (patches, pre-activation grads):
    A the mean of the patch rows' outer products (with the bias 1), G dataset_scale x the sum over the rows."""
    opt = _Recorder()
    scale = _compile_and_step(model, x, y, opt)
    for p, layers in expected.items():
        for layer, (patches, e) in layers.items():
            rows, grads = patches.reshape(-1, patches.shape[-1]), e.reshape(-1, e.shape[-1])
            _assert_factors(
                {k: v[p] for k, v in opt.factors[layer].items()},
                {"A": _a_factor(rows), "G": _g_factor(grads, scale)},
                f"{layer}[{p}]",
            )


def _im2col(x, k, stride, pad):
    """Explicit patches (B, H'W', k*k*C) in (kh, kw, C) order (not tf.image.extract_patches)."""
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    out = (x.shape[1] - k) // stride + 1
    rows = [
        x[:, i * stride : i * stride + k, j * stride : j * stride + k, :].reshape(len(x), -1)
        for i in range(out)
        for j in range(out)
    ]
    return np.stack(rows, 1)


def test_conv_factors_match_explicit_patches_and_pre_activation_gradients():
    """KFC (Grosse & Martens 2016): A over the B*|T| patch rows (mean), G = dataset_scale * sum over the
    B*|T| rows; the second conv has a particle input (grouped path)."""
    rng = np.random.default_rng(2)
    n, b = 2, 3
    inputs = keras.Input((5, 5, 2))
    h = bk.layers.Conv2D(3, 3, padding="same", activation="tanh", num_particles=n, name="c1")(
        inputs
    )
    h = bk.layers.Conv2D(2, 2, strides=2, activation="tanh", name="c2")(h)
    h = bk.layers.Flatten()(h)
    out = bk.layers.Dense(3, name="d")(h)
    model = bk.BayesianModel(inputs, out, likelihood="categorical")
    x = rng.standard_normal((b, 5, 5, 2)).astype(np.float32)
    y = rng.integers(0, 3, b)
    k1, b1, k2, b2, wd, bd = model.particle_variables
    expected = {}
    for p in range(n):
        with tf.GradientTape() as tape:
            z1 = tf.nn.conv2d(x, k1[p], 1, "SAME") + b1[p]
            h1 = tf.tanh(z1)
            z2 = tf.nn.conv2d(h1, k2[p], 2, "VALID") + b2[p]
            z3 = tf.matmul(tf.reshape(tf.tanh(z2), (b, -1)), wd[p]) + bd[p]
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, z3))
        e1, e2, e3 = (_np(g) for g in tape.gradient(loss, [z1, z2, z3]))
        expected[p] = {
            "c1": (_im2col(x.astype(np.float64), 3, 1, 1), e1),
            "c2": (_im2col(_np(h1), 2, 2, 0), e2),
            "d": (_np(tf.reshape(tf.tanh(z2), (b, -1)))[:, None], e3[:, None]),
        }
    _step_and_compare_patch_factors(model, x, y, expected)


def _im2col_1d(x, k, stride, dilation, left, right):
    """Explicit patches (B, T', k*C) in (k, C) order of sequences x (B, T, C) padded by left / right steps."""
    x = np.pad(x, ((0, 0), (left, right), (0, 0)))
    span = (k - 1) * dilation + 1
    out = (x.shape[1] - span) // stride + 1
    rows = [
        x[:, t * stride : t * stride + span : dilation, :].reshape(len(x), -1) for t in range(out)
    ]
    return np.stack(rows, 1)


def test_conv1d_factors_match_explicit_patches_and_pre_activation_gradients():
    """Conv1D as KFC's convolution with the T' output steps as locations: a causal dilated first layer (the
    particle axis starts there) and a strided 'same' layer on particle inputs."""
    rng = np.random.default_rng(3)
    n, b = 2, 3
    inputs = keras.Input((9, 2))
    h = bk.layers.Conv1D(
        3, 3, padding="causal", dilation_rate=2, activation="tanh", num_particles=n, name="c1"
    )(inputs)
    h = bk.layers.Conv1D(2, 2, strides=2, padding="same", activation="tanh", name="c2")(h)
    h = bk.layers.Flatten()(h)
    out = bk.layers.Dense(3, name="d")(h)
    model = bk.BayesianModel(inputs, out, likelihood="categorical")
    x = rng.standard_normal((b, 9, 2)).astype(np.float32)
    y = rng.integers(0, 3, b)
    k1, b1, k2, b2, wd, bd = model.particle_variables
    expected = {}
    for p in range(n):
        with tf.GradientTape() as tape:
            # dilation 2 as a kernel with zeros between its taps (Eigen has no dilated input gradient)
            zero = tf.zeros_like(k1[p][0])
            dilated = tf.stack([k1[p][0], zero, k1[p][1], zero, k1[p][2]])
            z1 = tf.nn.conv1d(tf.pad(x, [[0, 0], [4, 0], [0, 0]]), dilated, 1, "VALID") + b1[p]
            h1 = tf.tanh(z1)
            z2 = (
                tf.nn.conv1d(tf.pad(h1, [[0, 0], [0, 1], [0, 0]]), k2[p], 2, "VALID") + b2[p]
            )  # 'same', T=9
            z3 = tf.matmul(tf.reshape(tf.tanh(z2), (b, -1)), wd[p]) + bd[p]
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, z3))
        e1, e2 = (_np(g) for g in tape.gradient(loss, [z1, z2]))
        expected[p] = {
            "c1": (_im2col_1d(x.astype(np.float64), 3, 1, 2, 4, 0), e1),
            "c2": (_im2col_1d(_np(h1), 2, 2, 1, 0, 1), e2),
        }
    _step_and_compare_patch_factors(model, x, y, expected)


def _cell(kind, reset_after, kernel, recurrent, bias, xs):
    """An explicit recurrence over the time steps xs (list of (B, F) tensors, processing order).

    Returns the states and the per-step tensors whose gradients are the pre-activation gradients:
    "a" = x_t W + b_in, "g" = the recurrent pre-activation (h U (+ b_rec)), for GRU reset_before
    "g_zr" = h U_zr and "c" = (r h) U_h; plus the inputs "h_prev" and "rh" = r * h_prev.
    """
    units = recurrent.shape[0]
    b_in, b_rec = (bias[0], bias[1]) if kind == "gru" and reset_after else (bias, None)
    h = tf.zeros((xs[0].shape[0], units), tf.float64)
    c = tf.zeros_like(h)
    out = {key: [] for key in ("a", "g", "g_zr", "c", "h_prev", "rh")}
    hs = []
    for x_t in xs:
        a = tf.matmul(x_t, kernel) + b_in
        out["a"].append(a)
        out["h_prev"].append(h)
        if kind == "simple_rnn":
            g = tf.matmul(h, recurrent)
            out["g"].append(g)
            h = tf.tanh(a + g)
        elif kind == "lstm":
            g = tf.matmul(h, recurrent)
            out["g"].append(g)
            zi, zf, zc, zo = tf.split(a + g, 4, axis=-1)
            c = tf.sigmoid(zf) * c + tf.sigmoid(zi) * tf.tanh(zc)
            h = tf.sigmoid(zo) * tf.tanh(c)
        elif reset_after:
            g = tf.matmul(h, recurrent) + b_rec
            out["g"].append(g)
            a_z, a_r, a_h = tf.split(a, 3, axis=-1)
            g_z, g_r, g_h = tf.split(g, 3, axis=-1)
            z, r = tf.sigmoid(a_z + g_z), tf.sigmoid(a_r + g_r)
            h = z * h + (1 - z) * tf.tanh(a_h + r * g_h)
        else:
            g_zr = tf.matmul(h, recurrent[:, : 2 * units])
            out["g_zr"].append(g_zr)
            a_z, a_r, a_h = tf.split(a, 3, axis=-1)
            g_z, g_r = tf.split(g_zr, 2, axis=-1)
            z, r = tf.sigmoid(a_z + g_z), tf.sigmoid(a_r + g_r)
            out["rh"].append(r * h)
            cand = tf.matmul(r * h, recurrent[:, 2 * units :])
            out["c"].append(cand)
            h = z * h + (1 - z) * tf.tanh(a_h + cand)
        hs.append(h)
    return hs, out


_RNNS = {
    "simple_rnn": lambda **kw: bk.layers.SimpleRNN(3, **kw),
    "lstm": lambda **kw: bk.layers.LSTM(3, **kw),
    "gru": lambda **kw: bk.layers.GRU(3, **kw),
    "gru_reset_before": lambda **kw: bk.layers.GRU(3, reset_after=False, **kw),
}


@pytest.mark.parametrize(
    "cell,variant",
    [
        ("gru", "plain"),
        ("gru_reset_before", "plain"),
        ("lstm", "plain"),
        ("simple_rnn", "plain"),
        ("gru", "bidirectional"),
        ("gru_reset_before", "sequences"),
        ("lstm", "stacked"),
    ],
)
def test_recurrent_factors_match_an_explicit_time_loop(cell, variant):
    """Time steps as locations. "bidirectional": the two directions record separately (the backward one
    runs on reversed time); "sequences": return_sequences=True feeding a Dense applied at every time
    step (a Dense with T locations), then Flatten and a Dense head; "stacked": a SimpleRNN sequence
    feeding the cell (a recurrent layer with a particle input)."""
    rng = np.random.default_rng(3)
    n, b, steps, feats = 2, 4, 5, 2
    inputs = keras.Input((steps, feats))
    if variant == "bidirectional":
        h = bk.layers.Bidirectional(_RNNS[cell](num_particles=n, name="rnn"))(inputs)
        rnns = ["forward_rnn", "backward_rnn"]
    elif variant == "sequences":
        h = _RNNS[cell](num_particles=n, return_sequences=True, name="rnn")(inputs)
        h = bk.layers.Dense(2, activation="tanh", name="td")(h)
        h = bk.layers.Flatten()(h)
        rnns = ["rnn"]
    elif variant == "stacked":
        h = _RNNS["simple_rnn"](num_particles=n, return_sequences=True, name="rnn0")(inputs)
        h = _RNNS[cell](name="rnn")(h)
        rnns = ["rnn0", "rnn"]
    else:
        h = _RNNS[cell](num_particles=n, name="rnn")(inputs)
        rnns = ["rnn"]
    out = bk.layers.Dense(2, name="head")(h)
    model = bk.BayesianModel(inputs, out, likelihood=bk.likelihoods.Normal(scale=SIGMA))
    x = rng.standard_normal((b, steps, feats))
    y = rng.standard_normal((b, 2))
    layers = {layer.name: layer for layer in model.particle_layers}
    cells = {name: cell for name in rnns}
    if variant == "stacked":
        cells["rnn0"] = "simple_rnn"

    expected = {}
    for p in range(n):
        watched, stats = {}, {}
        with tf.GradientTape() as tape:
            features, below = [], None
            for name in rnns:
                layer = layers[name]
                kernel, recurrent, bias = (tf.constant(_np(v)[p]) for v in layer.particle_variables)
                tape.watch([kernel, recurrent, bias])  # so that the tape records the explicit loop
                seq = below or [tf.constant(x[:, t]) for t in range(steps)]
                if layer.go_backwards:
                    seq = seq[::-1]
                kind = "gru" if cells[name].startswith("gru") else cells[name]
                hs, parts = _cell(kind, cells[name] == "gru", kernel, recurrent, bias, seq)
                watched[name], stats[name] = parts, seq
                if variant == "stacked" and name == "rnn0":
                    below = hs
                    continue
                features.append(hs if variant == "sequences" else hs[-1])
            if variant == "sequences":
                wt, bt = (tf.constant(_np(v)[p]) for v in layers["td"].particle_variables)
                z_td = [tf.matmul(h_t, wt) + bt for h_t in features[0]]
                feat = tf.concat(
                    [tf.tanh(z) for z in z_td], axis=-1
                )  # Flatten of (T, 2) in time-major order
            else:
                feat = tf.concat(features, axis=-1)
            wh, bh = (tf.constant(_np(v)[p]) for v in layers["head"].particle_variables)
            z_head = tf.matmul(feat, wh) + bh
            loss = tf.reduce_sum(0.5 * tf.square((y - z_head) / SIGMA))
        keys = [
            (name, key) for name in rnns for key in ("a", "g", "g_zr", "c") if watched[name][key]
        ]
        flat = [t for name, key in keys for t in watched[name][key]]
        extra = z_td if variant == "sequences" else []
        grads = tape.gradient(loss, flat + extra + [z_head])
        grad_of, i = {}, 0
        for name, key in keys:
            m = len(watched[name][key])
            grad_of[(name, key)] = np.concatenate(
                [_np(g) for g in grads[i : i + m]], 0
            )  # (T*B, width)
            i += m
        exp = {}
        for name in rnns:
            parts = watched[name]
            rows_x = np.concatenate([_np(t) for t in stats[name]], 0)
            h_prev = np.concatenate([_np(t) for t in parts["h_prev"]], 0)
            e = grad_of[(name, "a")]
            exp[name] = {"A_in": (rows_x, True), "G": (e, None)}
            if cells[name] == "gru":
                exp[name].update({"A_rec": (h_prev, True), "G_rec": (grad_of[(name, "g")], None)})
            elif cells[name] == "gru_reset_before":
                u = h_prev.shape[1]
                # the recurrent blocks use G's corners: check the gradients they stand for
                np.testing.assert_allclose(
                    grad_of[(name, "g_zr")], e[:, : 2 * u], rtol=1e-10, atol=1e-12
                )
                np.testing.assert_allclose(
                    grad_of[(name, "c")], e[:, 2 * u :], rtol=1e-10, atol=1e-12
                )
                rh = np.concatenate([_np(t) for t in parts["rh"]], 0)
                exp[name].update({"A_rec": (h_prev, False), "A_reset": (rh, False)})
            else:
                np.testing.assert_allclose(
                    grad_of[(name, "g")], e, rtol=1e-10, atol=1e-12
                )  # additive
                exp[name]["A_rec"] = (h_prev, False)
        if variant == "sequences":
            g_td = np.concatenate([_np(g) for g in grads[i : i + steps]], 0)
            exp["td"] = {
                "A": (np.concatenate([_np(t) for t in features[0]], 0), True),
                "G": (g_td, None),
            }
        exp["head"] = {"A": (_np(feat), True), "G": (_np(grads[-1]), None)}
        expected[p] = exp

    opt = _Recorder()
    scale = _compile_and_step(model, x.astype(np.float32), y.astype(np.float32), opt)
    for p in range(n):
        for layer, facs in expected[p].items():
            want = {
                k: (_a_factor(rows, bias) if bias is not None else _g_factor(rows, scale))
                for k, (rows, bias) in facs.items()
            }
            assert set(opt.factors[layer]) == set(want)
            _assert_factors({k: v[p] for k, v in opt.factors[layer].items()}, want, f"{layer}[{p}]")


# -- the preconditioner ------------------------------------------------------------------------------
def test_damping_split_formula():
    rng = np.random.default_rng(4)
    a0, g0 = rng.standard_normal((2, 4, 4)), rng.standard_normal((2, 3, 3))
    a = np.einsum("nij,nkj->nik", a0, a0)
    g = 50.0 * np.einsum("nij,nkj->nik", g0, g0)
    lam = 0.3
    for split in (True, False):
        got = [t.numpy() for t in damped_inverses(tf.constant(a), tf.constant(g), lam, split)]
        for p in range(2):
            pi = np.sqrt((np.trace(a[p]) / 4) / (np.trace(g[p]) / 3)) if split else 1.0
            a_d, g_d = a[p] + pi * np.sqrt(lam) * np.eye(4), g[p] + np.sqrt(lam) / pi * np.eye(3)
            np.testing.assert_allclose(got[0][p], a_d, rtol=1e-12)
            np.testing.assert_allclose(got[1][p], np.linalg.inv(a_d), rtol=1e-9)
            np.testing.assert_allclose(got[2][p], np.linalg.slogdet(a_d)[1], rtol=1e-12)
            np.testing.assert_allclose(got[3][p], g_d, rtol=1e-12)
            np.testing.assert_allclose(got[4][p], np.linalg.inv(g_d), rtol=1e-9)
            np.testing.assert_allclose(got[5][p], np.linalg.slogdet(g_d)[1], rtol=1e-12)
    # split damping multiplies out to lambda I + the cross terms pi sqrt(lam) I (x) G + sqrt(lam)/pi A (x) I
    got = damped_inverses(tf.constant(a[:1]), tf.constant(g[:1]), lam)
    pi = np.sqrt((np.trace(a[0]) / 4) / (np.trace(g[0]) / 3))
    full = np.kron(got[0].numpy()[0], got[3].numpy()[0])
    cross = (
        np.kron(a[0], g[0])
        + lam * np.eye(12)
        + pi * np.sqrt(lam) * np.kron(np.eye(4), g[0])
        + np.sqrt(lam) / pi * np.kron(a[0], np.eye(3))
    )
    np.testing.assert_allclose(full, cross, rtol=1e-10)


def _regression(seed, n=2, b=6, fisher="empirical", num_batches=5):
    rng = np.random.default_rng(seed)
    inputs = keras.Input((3,))
    h = bk.layers.Dense(4, activation="tanh", num_particles=n, name="d1")(inputs)
    out = bk.layers.Dense(2, name="d2")(h)
    model = bk.BayesianModel(inputs, out, likelihood=bk.likelihoods.Normal(scale=SIGMA))
    batches = [
        (
            rng.standard_normal((b, 3)).astype(np.float32),
            rng.standard_normal((b, 2)).astype(np.float32),
        )
        for _ in range(num_batches)
    ]
    return model, batches


@pytest.mark.parametrize("factor_period,period", [(1, 3), (2, 4)])
def test_ema_schedule_and_inversion_period(factor_period, period):
    """Steps t = 1, 2, ...: statistics (batch factors into the running average, rho_u = min(1 - 1/u, decay)
    with u counting the statistics updates) on every step t <= period (warm-up) and then on t = 0 mod
    factor_period; damped inverses (pi split, lambda = damping + prior precision / T) of the CURRENT running
    average on every statistics update of the warm-up, then on t = 0 mod period; untouched otherwise.
    (The warm-up: the inverse after t < period steps is that of the average of t batches, not of the first
    batch alone, which made early steps diverge.)"""
    decay, damping, steps = 0.6, 1e-2, 9
    model, batches = _regression(5, num_batches=steps)
    pre = bk.preconditioners.KFACPreconditioner(
        damping=damping, ema_decay=decay, inversion_period=period, factor_period=factor_period
    )
    opt = _KFACNewton(pre, learning_rate=1e-3)
    model.compile(optimizer=opt, dataset_size=DATASET, temperature=TEMPERATURE, run_eagerly=True)
    ema, inverses, updates, inverted = None, [], 0, []
    for t, (x, y) in enumerate(batches, start=1):
        model.train_on_batch(x, y)
        if t <= period or t % factor_period == 0:
            updates += 1
            batch = opt.batches[-1]
            rho = min(1 - 1 / updates, decay)
            ema = (
                batch
                if ema is None
                else [{k: rho * e[k] + (1 - rho) * f[k] for k in f} for e, f in zip(ema, batch)]
            )
        assert int(pre.updates) == updates
        for layer_vars, want in zip(pre.factor_variables, ema):
            for name, variable in layer_vars.items():
                np.testing.assert_allclose(
                    _np(variable), want[name], rtol=1e-5, atol=1e-7 * np.abs(want[name]).max()
                )
        blocks = pre.block_variables(0)["weights"]
        inverses.append(_np(blocks["a_inv"]))
        if t <= period or t % period == 0:  # just inverted: check against numpy
            inverted.append(t)
            lam = damping + 1.0 / TEMPERATURE  # default N(0, 1) prior, temperature 0.5
            for k, layer_vars in enumerate(pre.factor_variables):
                bv = pre.block_variables(k)["weights"]
                a, g = ema[k]["A"], ema[k]["G"]
                for p in range(2):
                    pi = np.sqrt((np.trace(a[p]) / len(a[p])) / (np.trace(g[p]) / len(g[p])))
                    a_d = a[p] + pi * np.sqrt(lam) * np.eye(len(a[p]))
                    g_d = g[p] + np.sqrt(lam) / pi * np.eye(len(g[p]))
                    np.testing.assert_allclose(
                        _np(bv["a_inv"])[p], np.linalg.inv(a_d), rtol=2e-4, atol=1e-6
                    )
                    np.testing.assert_allclose(
                        _np(bv["g_inv"])[p],
                        np.linalg.inv(g_d),
                        rtol=2e-4,
                        atol=1e-6 * np.abs(np.linalg.inv(g_d)).max(),
                    )
                    want_logdet = (
                        len(g_d) * np.linalg.slogdet(a_d)[1] + len(a_d) * np.linalg.slogdet(g_d)[1]
                    )
                    np.testing.assert_allclose(_np(bv["log_det"])[p], want_logdet, rtol=1e-5)
        else:
            np.testing.assert_array_equal(inverses[-1], inverses[-2])
    assert inverted == {3: [1, 2, 3, 6, 9], 4: [1, 2, 3, 4, 8]}[period]
    assert updates == {1: 9, 2: 6}[factor_period]  # (2, 4): steps 1, 2, 3, 4, 6, 8
    assert all(
        np.abs(inverses[t] - inverses[t - 1]).max() > 1e-4 for t in range(1, period)
    )  # warm-up moves


def test_kfac_newton_step_solves_linear_gaussian_least_squares():
    """Closed form. One linear Dense layer, Normal likelihood with noise sigma, targets placed at
    residuals (+-sigma, +-sigma) in all four sign patterns, so sum_b e_b e_b^T = (B / sigma^2) I and
    A (x) G = (n / (B T sigma^2)) sum_b a~ a~^T (x) I is EXACTLY the Hessian of the tempered negative log
    likelihood. With negligible prior and damping, one step x <- x - Q^{-1} grad lands on the least-
    squares solution, from any start."""
    rng = np.random.default_rng(6)
    inputs = keras.Input((3,))
    out = bk.layers.Dense(
        2,
        num_particles=1,
        kernel_prior=bk.priors.Normal(scale=1e6),
        bias_prior=bk.priors.Normal(scale=1e6),
        name="lin",
    )(inputs)
    model = bk.BayesianModel(inputs, out, likelihood=bk.likelihoods.Normal(scale=SIGMA))
    x = rng.standard_normal((8, 3)).astype(np.float32)
    signs = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1]] * 2, np.float32)
    y = model.predict_particles(x)[:, 0] + SIGMA * signs
    solution = np.linalg.lstsq(
        _homogeneous(x.astype(np.float64)), y.astype(np.float64), rcond=None
    )[0]
    kernel, bias = model.particle_variables
    start = np.concatenate([_np(kernel)[0], _np(bias)], 0)
    opt = _KFACNewton(bk.preconditioners.KFACPreconditioner(damping=1e-12), learning_rate=1.0)
    model.compile(optimizer=opt, dataset_size=80, temperature=0.8, run_eagerly=True)
    model.train_on_batch(x, y)
    got = np.concatenate([_np(kernel)[0], _np(bias)], 0)
    assert np.abs(start - solution).max() > 0.1
    np.testing.assert_allclose(got, solution, rtol=1e-4, atol=1e-4)


def _gru_dense_model(n=2):
    inputs = keras.Input((4, 2))
    h = bk.layers.GRU(3, reset_after=False, num_particles=n, name="gru")(inputs)
    out = bk.layers.Dense(2, name="d")(h)
    return bk.BayesianModel(inputs, out, likelihood=bk.likelihoods.Normal(scale=SIGMA))


def test_curvature_operators_against_explicit_kronecker_matrices():
    """solve(apply(v)) = v per particle and for the mean; for the Dense layer apply is the explicit
    kron(A, G) on vec([kernel; bias]) and log_det its slogdet; the GRU's log-det is the sum over its
    three Kronecker blocks; Q_bar = damp(mean A) (x) damp(mean G)."""
    rng = np.random.default_rng(7)
    model = _gru_dense_model()
    pre = bk.preconditioners.KFACPreconditioner(damping=0.1)
    opt = _KFACNewton(pre, learning_rate=1e-3)
    model.compile(optimizer=opt, dataset_size=40, run_eagerly=True)
    x, y = (
        rng.standard_normal((5, 4, 2)).astype(np.float32),
        rng.standard_normal((5, 2)).astype(np.float32),
    )
    model.train_on_batch(x, y)
    curv = pre.curvature()
    dims = [
        int(np.prod(v.shape[1:])) for v in model.particle_variables
    ]  # gru: kernel, recurrent, bias; d
    assert curv.blocks == [[0, 1, 2], [3, 4]]
    vs = [tf.constant(rng.standard_normal((2, d)), tf.float32) for d in dims]
    wide = [tf.constant(rng.standard_normal((2, 3, d)), tf.float32) for d in dims]
    for v, back in zip(vs + wide, curv.solve(curv.apply(vs)) + curv.solve(curv.apply(wide))):
        np.testing.assert_allclose(back.numpy(), v.numpy(), rtol=1e-3, atol=1e-4)
    for v, back in zip(vs, curv.solve_mean(curv.apply_mean(vs))):
        np.testing.assert_allclose(back.numpy(), v.numpy(), rtol=1e-3, atol=1e-4)
    # None entries: a whole layer may be absent, not half of one
    partial = curv.apply([None, None, None] + vs[3:])
    assert partial[:3] == [None, None, None]
    with pytest.raises(ValueError, match="one layer block"):
        curv.apply([vs[0], None, None, None, None])
    dense = pre.block_variables(1)["weights"]
    a, g = _np(dense["a"]), _np(dense["g"])
    explicit = [np.kron(a[p], g[p]) for p in range(2)]
    joined = np.concatenate([_np(v) for v in vs[3:]], 1)  # vec_r([kernel; bias])
    applied = np.concatenate([t.numpy() for t in curv.apply(vs)[3:]], 1)
    for p in range(2):
        np.testing.assert_allclose(applied[p], explicit[p] @ joined[p], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        curv.log_det([3, 4]).numpy(), [np.linalg.slogdet(q)[1] for q in explicit], rtol=1e-5
    )
    gru = pre.block_variables(0)
    assert set(gru) == {"input", "recurrent_zr", "recurrent_h"}
    want = sum(
        np.array([np.linalg.slogdet(np.kron(_np(b["a"])[p], _np(b["g"])[p]))[1] for p in range(2)])
        for b in gru.values()
    )
    np.testing.assert_allclose(curv.log_det([0, 1, 2]).numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(
        curv.log_det().numpy(), want + curv.log_det([3, 4]).numpy(), rtol=1e-6
    )
    with pytest.raises(ValueError, match="one layer block"):
        curv.log_det([0, 1])
    # the mean: damp(mean_l A_l) (x) damp(mean_l G_l)
    raw = pre.factor_variables[1]
    am, _, _, gm, _, _ = damped_inverses(
        tf.constant(_np(raw["A"]).mean(0)), tf.constant(_np(raw["G"]).mean(0)), 0.1 + 1.0
    )  # damping + N(0, 1) prior precision, T = 1
    mean_applied = np.concatenate([t.numpy() for t in curv.apply_mean(vs)[3:]], 1)
    np.testing.assert_allclose(
        mean_applied, joined @ np.kron(am.numpy(), gm.numpy()), rtol=1e-4, atol=1e-4
    )


def test_nonfinite_factors_are_reported_and_leave_the_state_untouched():
    model, batches = _regression(8)
    pre = bk.preconditioners.KFACPreconditioner(inversion_period=1)
    opt = _KFACNewton(pre, learning_rate=1e-3)
    model.compile(optimizer=opt, dataset_size=DATASET, run_eagerly=True)
    model.train_on_batch(*batches[0])
    before = [_np(v) for v in opt.variables]
    good = opt.records
    bad = [
        bk.curvature.LayerRecord(
            r.layer,
            r.inputs * np.float32(np.inf) if i == 0 else r.inputs,
            r.preactivations,
            r.output_gradients,
            r.dataset_scale,
            temperature=r.temperature,
        )
        for i, r in enumerate(good)
    ]
    curv = pre.update(None, None, bad)
    assert not bool(curv.is_finite())
    assert int(pre.updates) == 1
    for b, v in zip(before, opt.variables):
        np.testing.assert_array_equal(_np(v), b)
    assert all(np.all(np.isfinite(_np(v))) for v in opt.variables)
    assert bool(pre.update(None, None, good).is_finite()) and int(pre.updates) == 2


class _Scaled(bk.layers.ParticleLayer):
    """A particle layer KFAC does not know: y = x * scale (a "scale" variable)."""

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=2)
        self.scale = self.add_particle_weight(
            "scale", (input_shape[-1],), "ones", self.kernel_prior, 1
        )

    def call(self, x):
        return x * self.scale[None]


class _Hidden(bk.layers.ParticleLayer):
    """Looks like a Dense to its variables (a "kernel" (N, in, out)) but records nothing."""

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=2)
        self.kernel = self.add_particle_weight(
            "kernel", (input_shape[-1], 2), "glorot_uniform", self.kernel_prior, input_shape[-1]
        )

    def call(self, x):
        return tf.einsum("bni,nio->bno", x, self.kernel)


def test_unsupported_layers_and_mismatches_are_reported():
    x, y = np.zeros((4, 3), np.float32), np.zeros((4, 2), np.float32)

    def model_with(layer):
        inputs = keras.Input((3,))
        h = bk.layers.Dense(3, num_particles=2)(inputs)
        return bk.BayesianModel(inputs, layer(h), likelihood=bk.likelihoods.Normal(scale=1.0))

    model = model_with(_Scaled())
    model.compile(optimizer=bk.optimizers.MatrixSVGD(0.1, "kfac"))
    with pytest.raises(ValueError, match="not those of a supported particle layer"):
        model.fit(x, y, verbose=0)
    model = model_with(_Hidden())
    model.compile(optimizer=bk.optimizers.MatrixSVGD(0.1, "kfac"))
    with pytest.raises(ValueError, match="no curvature was captured"):
        model.fit(x, y, verbose=0)
    # the functional door has no layers
    with pytest.raises(ValueError, match="grouped by layer"):
        bk.run_particles(
            lambda p: -tf.reduce_sum(p**2, 1),
            np.zeros((3, 2)),
            bk.optimizers.MatrixSVGD(0.1, "kfac"),
            2,
        )
    with pytest.raises(ValueError, match="deterministic"):
        layer = bk.layers.Dense(2, deterministic=True)
        layer.build((None, 2, 3))
        bk.curvature.kronecker_spec(layer)
    with pytest.raises(ValueError, match="not supported"):
        bk.curvature.sampled_negative_log_likelihood(object(), tf.zeros((2, 2, 2)))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: bk.preconditioners.KFACPreconditioner(damping=0.0), "damping must be a positive"),
        (lambda: bk.preconditioners.KFACPreconditioner(ema_decay=1.0), "ema_decay"),
        (lambda: bk.preconditioners.KFACPreconditioner(inversion_period=0), "inversion_period"),
        (
            lambda: bk.preconditioners.KFACPreconditioner(factor_period=0),
            "factor_period must be a positive",
        ),
        (
            lambda: bk.preconditioners.KFACPreconditioner(inversion_period=20, factor_period=3),
            "multiple of factor_period",
        ),
        (lambda: bk.preconditioners.KFACPreconditioner(fisher="exact"), "fisher must be one of"),
    ],
)
def test_bad_arguments_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_config_round_trip():
    pre = bk.preconditioners.KFACPreconditioner(
        damping=3e-2,
        ema_decay=0.9,
        inversion_period=14,
        fisher="true",
        damping_split=False,
        include_prior=False,
        factor_period=7,
    )
    again = bk.preconditioners.KFACPreconditioner.from_config(pre.get_config())
    assert again.get_config() == pre.get_config() and again.factor_period == 7
    old = {
        k: v for k, v in pre.get_config().items() if k != "factor_period"
    }  # a config saved before factor_period
    assert bk.preconditioners.KFACPreconditioner.from_config(old).factor_period == 1
    restored = keras_round_trip(pre, None)
    assert isinstance(restored, bk.preconditioners.KFACPreconditioner)
    assert (
        restored.get_config() == pre.get_config()
        and restored.curvature_request
        == bk.curvature.CurvatureRequest("kronecker_factors", "sampled")
    )
    assert isinstance(bk.preconditioners.get("kfac"), bk.preconditioners.KFACPreconditioner)
    assert bk.preconditioners.get("kfac").curvature_request == bk.curvature.CurvatureRequest(
        "kronecker_factors"
    )


def test_true_fisher_samples_labels_from_each_particle():
    """Categorical logits: the true Fisher's G of the output layer estimates, per particle,
    dataset_scale * sum_b (diag(p_b) - p_b p_b^T) (its expectation over the sampled labels); the
    empirical one uses the observed labels exactly."""
    rng = np.random.default_rng(9)
    n, b = 2, 3000
    inputs = keras.Input((2,))
    out = bk.layers.Dense(3, num_particles=n, name="d")(inputs)
    model = bk.BayesianModel(inputs, out, likelihood="categorical")
    x = (2.0 * rng.standard_normal((b, 2))).astype(np.float32)
    y = np.zeros(b, np.int64)  # far from the model's own predictive
    probs = tf.nn.softmax(model.predict_particles(x)).numpy().astype(np.float64)  # (B, N, 3)
    opt = _Recorder(fisher="true")
    model.compile(optimizer=opt, dataset_size=b, run_eagerly=True)
    model.train_on_batch(x, y)
    for p in range(n):
        want = sum(np.diag(q) - np.outer(q, q) for q in probs[:, p])  # dataset_scale = 1
        got = opt.factors["d"]["G"][p]
        np.testing.assert_allclose(got, want, atol=0.08 * np.abs(want).max())
        empirical = sum(np.outer(q - np.eye(3)[0], q - np.eye(3)[0]) for q in probs[:, p])
        assert np.abs(got - empirical).max() > 0.3 * np.abs(want).max()
    assert opt.records[0].sampled_output_gradients is not None


@pytest.mark.parametrize("mode", ["average", "mixture"])
def test_matrix_svgd_with_kfac_trains_and_survives_saving(tmp_path, mode):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2]).astype(np.float32)
    model = bk.zoo.mlp(3, 1, (8,), num_particles=4, likelihood=bk.likelihoods.Normal(scale=0.5))
    pre = bk.preconditioners.KFACPreconditioner(inversion_period=2)
    opt = bk.optimizers.MatrixSVGD(0.2, pre, mode=mode)
    model.compile(optimizer=opt)
    before = model.evaluate(x, y, verbose=0, return_dict=True)["nll"]
    model.fit(x, y, batch_size=16, epochs=4, verbose=0)
    after = model.evaluate(x, y, verbose=0, return_dict=True)["nll"]
    assert np.isfinite(after) and after < before
    assert int(pre.updates) == 16 and int(opt.skipped_curvature_steps) == 0
    assert all(np.all(np.isfinite(_np(v))) for v in opt.variables)
    loaded = keras_round_trip(model, tmp_path, "kfac")
    lpre = loaded.optimizer.preconditioner
    assert (
        isinstance(lpre, bk.preconditioners.KFACPreconditioner)
        and lpre.get_config() == pre.get_config()
    )
    assert int(lpre.updates) == 16
    for a, b in zip(pre.factor_variables, lpre.factor_variables):
        for name in a:
            np.testing.assert_array_equal(_np(a[name]), _np(b[name]))
    saved, restored = pre.block_variables(0)["weights"], lpre.block_variables(0)["weights"]
    assert set(saved) == set(restored)
    for name in saved:
        np.testing.assert_array_equal(_np(restored[name]), _np(saved[name]))
    loaded.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert int(lpre.updates) == 20


# -- factor ops, factor_period in a compiled fit, mean-only inversion ---------------------------------
@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("broadcasts", [True, False])
def test_conv_patches_equal_extract_patches(padding, broadcasts):
    """The gathered patches are tf.image.extract_patches' values (strides, dilation, uneven 'same' padding
    with the odd pixel at the bottom / right), also on the fallback path with unknown spatial sizes."""
    import types

    from bayes_keras.curvature import kfac as kfac_lib

    rng = np.random.default_rng(11)
    n, b, c = 3, 2, 2
    for (h, w), kernel, strides, dilation in [
        ((7, 8), (3, 2), (1, 1), (1, 1)),
        ((7, 8), (4, 3), (2, 3), (1, 1)),
        ((9, 6), (3, 3), (1, 2), (2, 1)),
        ((5, 5), (2, 2), (2, 2), (1, 1)),
    ]:
        layer = types.SimpleNamespace(
            kernel_size=kernel,
            strides=strides,
            dilation_rate=dilation,
            padding=padding,
            broadcasts=broadcasts,
            num_particles=n,
        )
        x = tf.constant(
            rng.standard_normal((b, h, w, c) if broadcasts else (b, h, w, n, c)), tf.float32
        )
        images = (
            x if broadcasts else tf.reshape(tf.transpose(x, [0, 3, 1, 2, 4]), (-1, h, w, c))
        )  # particle-major
        ref = tf.image.extract_patches(
            images, [1, *kernel, 1], [1, *strides, 1], [1, *dilation, 1], padding.upper()
        )
        ref = tf.reshape(ref, (b, 1 if broadcasts else n, -1, ref.shape[-1])).numpy()
        np.testing.assert_array_equal(kfac_lib.conv_patches(layer, x).numpy(), ref)
        spec = tf.TensorSpec(
            (b, None, None) + tuple(x.shape[3:]), tf.float32
        )  # spatial sizes unknown: fallback
        unknown = tf.function(lambda t: kfac_lib.conv_patches(layer, t), input_signature=[spec])  # noqa: B023
        np.testing.assert_array_equal(unknown(x).numpy(), ref)


class _Snapshots(keras.callbacks.Callback):
    def __init__(self, pre):
        super().__init__()
        self.pre, self.factors, self.means = pre, [], []

    def on_train_batch_end(self, batch, logs=None):
        self.factors.append(_np(self.pre.factor_variables[0]["A"]))
        self.means.append(_np(self.pre.block_variables(0)["weights"]["a_mean_inv"]))


def test_factor_period_schedule_in_a_compiled_fit():
    """In the compiled train step (tf.cond): with factor_period=2, inversion_period=4 the running factors
    move on steps 1-4 (warm-up) and then on even steps only, Q_bar^-1 on steps 1-4, 8, 12 only."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((12 * 8, 3)).astype(np.float32)
    y = (x[:, :1] - x[:, 1:2] ** 2).astype(np.float32)
    model = bk.zoo.mlp(3, 1, (5,), num_particles=3, likelihood=bk.likelihoods.Normal(scale=0.5))
    pre = bk.preconditioners.KFACPreconditioner(inversion_period=4, factor_period=2)
    model.compile(optimizer=bk.optimizers.MatrixSVGD(0.05, pre))
    snap = _Snapshots(pre)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[snap])
    assert int(pre.updates) == 4 + 4  # steps 1, 2, 3, 4, 6, 8, 10, 12

    def moved(
        series, t
    ):  # between the end of step t - 1 and the end of step t (t = 1: from the initial state)
        return t == 1 or not np.array_equal(series[t - 1], series[t - 2])

    assert [t for t in range(1, 13) if moved(snap.factors, t)] == [1, 2, 3, 4, 6, 8, 10, 12]
    assert [t for t in range(1, 13) if moved(snap.means, t)] == [1, 2, 3, 4, 8, 12]


class _FullKFACMatrixSVGD(bk.optimizers.MatrixSVGD):
    """MatrixSVGD that declares nothing: its KFAC preconditioner computes everything."""

    curvature_operators = None


def test_average_mode_inverts_only_the_mean_and_steps_as_with_full_inversion():
    """MatrixSVGD(mode="average") declares ("apply_mean", "solve_mean"): KFAC then computes no per-particle
    factors / inverses (their variables keep the identity) and the per-particle operators raise; the
    trajectory and Q_bar are those of a full inversion. The mixture mode keeps the per-particle inverses
    and does not compute the mean."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((48, 3)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2]).astype(np.float32)
    runs = {}
    for name, make in [("mean", bk.optimizers.MatrixSVGD), ("full", _FullKFACMatrixSVGD)]:
        keras.utils.set_random_seed(3)
        model = bk.zoo.mlp(3, 1, (6,), num_particles=3, likelihood=bk.likelihoods.Normal(scale=0.5))
        pre = bk.preconditioners.KFACPreconditioner(inversion_period=2)
        model.compile(optimizer=make(0.2, pre))
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        runs[name] = (model, pre)
    (mean_model, mean_pre), (full_model, full_pre) = runs["mean"], runs["full"]
    assert (mean_pre.inverts_per_particle, mean_pre.inverts_mean) == (False, True)
    assert (full_pre.inverts_per_particle, full_pre.inverts_mean) == (True, True)
    eye = np.broadcast_to(np.eye(4), (3, 4, 4))  # the first layer's A: 3 inputs + bias, 3 particles
    np.testing.assert_array_equal(
        _np(mean_pre.block_variables(0)["weights"]["a_inv"]), eye
    )  # never computed
    assert np.abs(_np(full_pre.block_variables(0)["weights"]["a_inv"]) - eye).max() > 1e-3
    for a, b in zip(mean_model.particle_variables, full_model.particle_variables):
        np.testing.assert_allclose(_np(a), _np(b), rtol=1e-6, atol=1e-7)
    for k in range(len(mean_pre.factor_variables)):
        full_blocks = full_pre.block_variables(k)
        for role, block in mean_pre.block_variables(k).items():
            for name in ("a_mean", "g_mean", "a_mean_inv", "g_mean_inv"):
                np.testing.assert_allclose(
                    _np(block[name]), _np(full_blocks[role][name]), rtol=1e-6, atol=1e-7
                )
    curvature = mean_pre.curvature()
    vs = [tf.zeros((3, int(np.prod(v.shape[1:])))) for v in mean_model.particle_variables]
    assert all(t is not None for t in curvature.solve_mean(vs))
    for call in (
        lambda: curvature.solve(vs),
        lambda: curvature.apply(vs),
        lambda: curvature.log_det(),
    ):
        with pytest.raises(ValueError, match="curvature_operators"):
            call()
    # the mixture: per-particle only
    model = bk.zoo.mlp(3, 1, (6,), num_particles=3, likelihood=bk.likelihoods.Normal(scale=0.5))
    pre = bk.preconditioners.KFACPreconditioner(inversion_period=2)
    model.compile(optimizer=bk.optimizers.MatrixSVGD(0.05, pre, mode="mixture"))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert (pre.inverts_per_particle, pre.inverts_mean) == (True, False)
    assert (
        np.abs(_np(pre.block_variables(0)["weights"]["a_inv"]) - np.eye(4)).max() > 1e-3
    )  # computed
    np.testing.assert_array_equal(
        _np(pre.block_variables(0)["weights"]["a_mean_inv"]), np.eye(4)
    )  # not
    with pytest.raises(ValueError, match="curvature_operators"):
        pre.curvature().solve_mean(vs)


def test_unknown_curvature_operators_are_rejected():
    class _Odd(bk.optimizers.MatrixSVGD):
        curvature_operators = ("solve", "inverse_sqrt")

    model = bk.zoo.mlp(3, 1, (4,), num_particles=2, likelihood=bk.likelihoods.Normal())
    model.compile(optimizer=_Odd(0.1, bk.preconditioners.KFACPreconditioner()))
    with pytest.raises(ValueError, match="curvature_operators must be"):
        model.fit(np.zeros((4, 3), np.float32), np.zeros((4, 1), np.float32), verbose=0)


def test_embedding_factors_are_token_frequencies_and_output_gradients():
    """Embedding -> GlobalAveragePooling1D -> Dense: A = the mean over the B*T positions of onehot onehot^T
    (the token frequencies on the diagonal), G = dataset_scale * sum of e e^T with e = d(-log p)/d(the
    embedding output), taken by autodiff on an explicit re-implementation; and for one example with one
    token A (x) G is exactly dataset_scale * g g^T of the table's gradient."""
    rng = np.random.default_rng(3)
    n, b, t, vocab, dim = 2, 4, 3, 6, 3
    tokens = keras.Input((t,), dtype="int32")
    h = bk.layers.Embedding(vocab, dim, num_particles=n, name="emb")(tokens)
    h = bk.layers.GlobalAveragePooling1D()(h)
    model = bk.BayesianModel(tokens, bk.layers.Dense(2, name="out")(h), likelihood="categorical")
    x, y = rng.integers(0, vocab, (b, t)).astype(np.int32), rng.integers(0, 2, b)
    table, kernel, bias = (v.numpy() for v in model.particle_variables)
    lookup = tf.Variable(np.stack([table[p][x] for p in range(n)], 1))  # (B, N, T, D), explicit
    with tf.GradientTape() as tape:
        logits = tf.einsum("bnd,ndk->bnk", tf.reduce_mean(lookup, 2), kernel) + bias[None]
        loss = -tf.reduce_sum(tf.gather(tf.nn.log_softmax(logits), y, axis=2, batch_dims=1))
    e = tape.gradient(loss, lookup).numpy().astype(np.float64)
    opt = _Recorder()
    scale = _compile_and_step(model, x, y, opt)
    one_hot = np.eye(vocab)[x.reshape(-1)]
    for p in range(n):
        _assert_factors(
            {k: v[p] for k, v in opt.factors["emb"].items()},
            {
                "A": one_hot.T @ one_hot / (b * t),
                "G": scale * e[:, p].reshape(-1, dim).T @ e[:, p].reshape(-1, dim),
            },
            f"emb[{p}]",
        )
    x1, y1 = x[:1, :1], y[:1]
    token = keras.Input((1,), dtype="int32")
    h = bk.layers.Embedding(vocab, dim, num_particles=n, name="emb")(token)
    model1 = bk.BayesianModel(
        token,
        bk.layers.Dense(2, name="out")(bk.layers.GlobalAveragePooling1D()(h)),
        likelihood="categorical",
    )
    with tf.GradientTape() as tape:
        loss = -tf.reduce_sum(model1.likelihood.log_prob(y1, model1(x1)))
    g_table = (
        tf.convert_to_tensor(tape.gradient(loss, model1.particle_variables[0]))
        .numpy()
        .astype(np.float64)
    )
    opt = _Recorder()
    scale = _compile_and_step(model1, x1, y1, opt)
    for p in range(n):
        g = g_table[p].ravel()
        kron = np.kron(opt.factors["emb"]["A"][p], opt.factors["emb"]["G"][p])
        np.testing.assert_allclose(kron, scale * np.outer(g, g), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("images", [True, False])
def test_batch_normalization_factors_are_the_diagonal_fisher_of_scale_and_shift(images):
    """Conv2D (or Dense) -> BatchNormalization -> relu -> global average -> Dense, re-implemented with explicit
    tensors: xhat from the batch statistics, y = gamma xhat + beta, e = d(-log p)/dy by autodiff. Per example
    g_gamma = sum over locations of e xhat, g_beta = sum of e; A_gamma = dataset_scale diag(sum_b g_gamma^2)."""
    rng = np.random.default_rng(5)
    n, b = 2, 6
    if images:
        inputs = keras.Input((4, 4, 2))
        z_layer = bk.layers.Conv2D(3, 3, padding="same", num_particles=n, name="z")
        x = rng.standard_normal((b, 4, 4, 2)).astype(np.float32)
    else:
        inputs = keras.Input((5,))
        z_layer = bk.layers.Dense(3, num_particles=n, name="z")
        x = rng.standard_normal((b, 5)).astype(np.float32)
    h = bk.layers.BatchNormalization(name="bn")(z_layer(inputs))
    h = bk.layers.Activation("relu")(h)
    if images:
        h = bk.layers.GlobalAveragePooling2D()(h)
    model = bk.BayesianModel(inputs, bk.layers.Dense(2, name="out")(h), likelihood="categorical")
    y = rng.integers(0, 2, b)
    bn, out = model.get_layer("bn"), model.get_layer("out")
    gamma, beta = bn.gamma.numpy(), bn.beta.numpy()
    z = z_layer(x).numpy().astype(np.float64)  # (B, H, W, N, C) or (B, N, C)
    axes = (0, 1, 2) if images else (0,)
    xhat = (z - z.mean(axes)) / np.sqrt(z.var(axes) + bn.epsilon)
    y_tensor = tf.Variable(xhat * gamma + beta)  # gamma, beta (N, C) broadcast on the last two axes
    with tf.GradientTape() as tape:
        a = tf.nn.relu(y_tensor)
        pooled = tf.reduce_mean(a, axis=(1, 2)) if images else a  # (B, N, C)
        logits = (
            tf.einsum("bnc,nck->bnk", pooled, out.kernel.numpy().astype(np.float64))
            + out.bias.numpy()
        )
        loss = -tf.reduce_sum(tf.gather(tf.nn.log_softmax(logits), y, axis=2, batch_dims=1))
    e = tape.gradient(loss, y_tensor).numpy()
    sum_axes = (1, 2) if images else ()
    g_gamma = (e * xhat).sum(sum_axes) if images else e * xhat  # (B, N, C)
    g_beta = e.sum(sum_axes) if images else e
    opt = _Recorder()
    scale = _compile_and_step(model, x, y, opt)
    factors = opt.factors["bn"]
    for p in range(n):
        np.testing.assert_allclose(
            factors["A_gamma"][p],
            scale * np.diag((g_gamma[:, p] ** 2).sum(0)),
            rtol=2e-3,
            atol=1e-6,
        )
        np.testing.assert_allclose(
            factors["A_beta"][p], scale * np.diag((g_beta[:, p] ** 2).sum(0)), rtol=2e-3, atol=1e-6
        )
        np.testing.assert_array_equal(factors["G_gamma"][p], [[1.0]])
    record = next(r for r in opt.records if r.layer is bn)
    squares = dict(
        (v.name, s.numpy()) for v, s in bk.curvature.per_example_squared_gradients(record)
    )
    np.testing.assert_allclose(squares["gamma"], (g_gamma**2).sum(0), rtol=2e-3, atol=1e-7)
    np.testing.assert_allclose(squares["beta"], (g_beta**2).sum(0), rtol=2e-3, atol=1e-7)
