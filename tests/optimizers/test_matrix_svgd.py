"""Matrix-valued-kernel SVGD (Wang et al. 2019) against ground truth: vanilla SVGD (Q = I), autodiff of
the matrix-valued kernels' Stein operator (Theorem 1), the change of variables (Lemma 2 / Theorem 3),
and explicit mixture weights.

Tolerances: the direction comparisons run in float64 (~1e-12); trajectories run in float32 through
the functional door and are compared to 1e-4 relative (float32 rounding accumulated over the steps).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy.stats import multivariate_normal

import bayes_keras as bk
from targets import correlated_gaussian_2d, keras_round_trip
from bayes_keras.optimizers.svgd.stein import (
    matrix_svgd_average_direction,
    matrix_svgd_mixture_direction,
    mixture_log_weights,
)
from bayes_keras.optimizers.svgd.svgd import svgd_direction
from bayes_keras.curvature.preconditioners import DenseCurvature, IdentityPreconditioner

N, D = 5, 3


def _spd(rng, n, d, spread=1.0):
    a = rng.standard_normal((n, d, d))
    return np.einsum("nij,nkj->nik", a, a) * spread + 0.3 * np.eye(d)


def _problem(seed, same_q=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D))
    g = rng.standard_normal((N, D))  # gradients of the NEGATIVE log density (any values will do)
    q = _spd(rng, 1 if same_q else N, D)
    q = np.broadcast_to(q, (N, D, D)).copy()
    return x, g, q


def _split(a):
    return [tf.constant(a[:, :1]), tf.constant(a[:, 1:])]


def _join(parts):
    return np.concatenate([p.numpy() for p in parts], axis=1)


def _median_h(x, metric):
    """The documented rule, in numpy: median over i < j of ||x_i - x_j||_Q^2, divided by log N."""
    diff = x[:, None] - x[None]
    d2 = np.einsum("ijd,de,ije->ij", diff, metric, diff)
    return np.median(d2[np.triu_indices(len(x), 1)]) / np.log(len(x))


def _reference_direction(kernel_fn, x, g):
    """Theorem 1 / Algorithm 1 by autodiff: phi_i = (1/N) sum_j [K(x_i, x_j) grad log p(x_j) +
    div_{x_j} K(x_i, x_j)], (div K)_l = sum_m d K_lm(x_i, x') / d x'_m. Returns -phi."""

    @tf.function
    def kernel_and_divergence(a, b):
        with tf.GradientTape() as tape:
            tape.watch(b)
            kmat = kernel_fn(a, b)
        jac = tape.jacobian(kmat, b)  # [l, m, s] = d K_lm / d x'_s
        return kmat, tf.reduce_sum(tf.linalg.diag_part(jac), axis=1)

    phi = np.zeros_like(x)
    for i in range(len(x)):
        for j in range(len(x)):
            kmat, div = kernel_and_divergence(tf.constant(x[i]), tf.constant(x[j]))
            phi[i] += kmat.numpy() @ (-g[j]) + div.numpy()
    return -phi / len(x)


def _rbf_q(q, h):
    qt = tf.constant(q)
    return lambda a, b: tf.exp(-tf.tensordot(a - b, tf.linalg.matvec(qt, a - b), 1) / h)


def _weights_fn(x, q, beta, metric):
    """w_l(y) for all anchors l (the particles), as a differentiable function of y."""
    z, qs = tf.constant(x), tf.constant(q)
    logdet = tf.constant(np.linalg.slogdet(q)[1])

    def w(y):
        diff = y[None] - z  # (L, D)
        if metric == "q":
            logits = beta * (-0.5 * tf.einsum("ld,lde,le->l", diff, qs, diff) + 0.5 * logdet)
        else:
            logits = beta * (-0.5 * tf.reduce_sum(diff**2, axis=1))
        return tf.nn.softmax(logits)

    return w


@pytest.mark.parametrize("metric", ["q", "euclidean"])
def test_identity_preconditioner_gives_vanilla_svgd(metric):
    x, g, _ = _problem(0)
    xs, gs = _split(x), _split(g)
    kernel = bk.kernels.RBF()
    vanilla = _join(svgd_direction(xs, gs, kernel, [[0, 1]]))
    identity = IdentityPreconditioner().update(xs)
    got = _join(matrix_svgd_average_direction(xs, gs, kernel, identity, [[0, 1]], metric))
    np.testing.assert_allclose(got, vanilla, atol=1e-12)
    dense_eye = DenseCurvature.from_matrices(
        tf.constant(np.broadcast_to(np.eye(D), (N, D, D)).copy()), dims=[1, 2]
    )
    got = _join(matrix_svgd_average_direction(xs, gs, kernel, dense_eye, [[0, 1]], metric))
    np.testing.assert_allclose(got, vanilla, atol=1e-12)
    # Q = c I only rescales the step by 1 / c (the median bandwidth absorbs c in the kernel)
    scaled = IdentityPreconditioner(4.0).update(xs)
    got = _join(matrix_svgd_average_direction(xs, gs, kernel, scaled, [[0, 1]], metric))
    np.testing.assert_allclose(got, vanilla / 4.0, atol=1e-12)


@pytest.mark.parametrize("metric", ["q", "euclidean"])
def test_average_mode_matches_autodiff_of_the_matrix_kernel(metric):
    """K(x, x') = Q^{-1} exp(-||x - x'||_Q^2 / h) (Eq. 13; "euclidean": Q^{-1} exp(-||x - x'||^2 / h)),
    which checks the constant 2 / h of the closed-form repulsion for this bandwidth convention."""
    x, g, q = _problem(1)
    curvature = DenseCurvature.from_matrices(tf.constant(q), dims=[1, 2])
    q_bar = q.mean(0)
    metric_matrix = q_bar if metric == "q" else np.eye(D)
    h = _median_h(x, metric_matrix)
    base = _rbf_q(metric_matrix, h)
    q_bar_inv = tf.constant(np.linalg.inv(q_bar))
    expected = _reference_direction(lambda a, b: q_bar_inv * base(a, b), x, g)
    got = _join(
        matrix_svgd_average_direction(
            _split(x), _split(g), bk.kernels.RBF(), curvature, [[0, 1]], metric
        )
    )
    np.testing.assert_allclose(got, expected, atol=1e-10)


@pytest.mark.parametrize("metric,beta", [("q", 1.0), ("q", 0.5), ("euclidean", 1.0)])
def test_mixture_mode_matches_autodiff_of_the_mixture_kernel(metric, beta):
    """K(x, x') = N sum_l w_l(x) w_l(x') Q_l^{-1} k_l(x, x') (Eqs. 16-17), differentiated through the
    weights: checks grad log w_l and every constant of the closed form."""
    x, g, q = _problem(2)
    curvature = DenseCurvature.from_matrices(tf.constant(q), dims=[1, 2])
    w = _weights_fn(x, q, beta, metric)
    q_inv = tf.constant(np.linalg.inv(q))
    if metric == "q":
        comps = [_rbf_q(q[k], _median_h(x, q[k])) for k in range(N)]
    else:
        shared = _rbf_q(np.eye(D), _median_h(x, np.eye(D)))
        comps = [shared] * N

    def kernel_fn(a, b):
        wa, wb = w(a), w(b)
        return N * tf.add_n([wa[k] * wb[k] * q_inv[k] * comps[k](a, b) for k in range(N)])

    expected = _reference_direction(kernel_fn, x, g)
    got, entropy = matrix_svgd_mixture_direction(
        _split(x), _split(g), bk.kernels.RBF(), curvature, [[0, 1]], metric, beta
    )
    np.testing.assert_allclose(_join(got), expected, atol=1e-10)
    weights = np.stack([w(tf.constant(xj)).numpy() for xj in x], 1)  # [l, j]
    assert float(entropy) == pytest.approx(
        np.mean(-np.sum(weights * np.log(weights), 0)), rel=1e-10
    )


def test_mixture_weights_are_normalised_gaussian_responsibilities():
    x, _, q = _problem(3)
    curvature = DenseCurvature.from_matrices(tf.constant(q))
    log_w, _, _ = mixture_log_weights([tf.constant(x)], curvature)
    w = np.exp(log_w.numpy())
    np.testing.assert_allclose(w.sum(0), 1.0, atol=1e-12)
    dens = np.array(
        [[multivariate_normal.pdf(xj, x[k], np.linalg.inv(q[k])) for xj in x] for k in range(N)]
    )
    np.testing.assert_allclose(w, dens / dens.sum(0), rtol=1e-9)


@pytest.mark.parametrize("metric", ["q", "euclidean"])
def test_mixture_with_uniform_weights_and_equal_q_is_average(metric):
    """beta = 0 gives w_l = 1/N; with Q_l = Q for all anchors the (N-normalised) mixture kernel is then
    exactly the average kernel. (With beta = 1 the weights still vary with x, so even equal Q_l give
    a different kernel: that case is covered by the autodiff test above.)"""
    x, g, q = _problem(4, same_q=True)
    curvature = DenseCurvature.from_matrices(tf.constant(q), dims=[1, 2])
    kernel = bk.kernels.RBF()
    average = _join(
        matrix_svgd_average_direction(_split(x), _split(g), kernel, curvature, [[0, 1]], metric)
    )
    mixture, entropy = matrix_svgd_mixture_direction(
        _split(x), _split(g), kernel, curvature, [[0, 1]], metric, 0.0
    )
    np.testing.assert_allclose(_join(mixture), average, atol=1e-12)
    assert float(entropy) == pytest.approx(np.log(N), rel=1e-12)


def _gaussian(seed, d=3):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((d, d)))
    prec = u @ np.diag(np.logspace(0, 1.5, d)) @ u.T  # condition number ~30
    mu = rng.standard_normal(d)
    return mu, prec


def test_average_mode_is_vanilla_svgd_after_the_change_of_variables():
    """Lemma 2 / Theorem 3: with the exact Hessian Q = P of a Gaussian target, average-mode matrix SVGD
    on x is vanilla SVGD on y = Q^{1/2} x (log p'(y) = log p(Q^{-1/2} y)), step by step."""
    mu, prec = _gaussian(5)
    lam, u = np.linalg.eigh(prec)
    half, inv_half = u @ np.diag(lam**0.5) @ u.T, u @ np.diag(lam**-0.5) @ u.T
    p32, m32, ih32 = (tf.constant(a, tf.float32) for a in (prec, mu, inv_half))

    def log_p(x):
        z = x - m32
        return -0.5 * tf.reduce_sum(tf.matmul(z, p32) * z, axis=1)

    x0 = np.random.default_rng(6).standard_normal((10, 3)) * 1.5
    hess = bk.preconditioners.HessianPreconditioner(
        min_eigenvalue=1e-3
    )  # below P's spectrum: no clipping
    matrix = bk.run_particles(log_p, x0, bk.optimizers.MatrixSVGD(0.2, hess, rescaling="none"), 200)
    vanilla = bk.run_particles(
        lambda y: log_p(tf.matmul(y, ih32)),
        x0 @ half,
        bk.optimizers.SVGD(0.2, step_rule="sgd"),
        200,
    )
    np.testing.assert_allclose(matrix.particles, vanilla.particles @ inv_half, rtol=1e-4, atol=1e-4)
    assert np.abs(matrix.particles - x0).max() > 0.5  # they did move
    # mixture: equal Hessians everywhere, uniform weights (beta = 0): the same trajectory
    mixture = bk.run_particles(
        log_p, x0, bk.optimizers.MatrixSVGD(0.2, hess, mode="mixture", mixture_beta=0.0), 200
    )
    np.testing.assert_allclose(mixture.particles, matrix.particles, rtol=1e-4, atol=1e-4)


def test_functional_door_modes_fit_a_correlated_gaussian():
    """2-D Gaussian, exact Hessian, 50 particles: both modes reach the mean and (as vanilla SVGD with
    the median bandwidth: measured 0.85-0.9 of the truth) a slightly under-dispersed covariance in the
    right orientation. The mixture's weight entropy is reported and equals the directly computed one."""
    mu, sigma, log_p = correlated_gaussian_2d()
    x0 = np.random.default_rng(7).standard_normal((50, 2)) * 1.5
    for mode in ["average", "mixture"]:
        opt = bk.optimizers.MatrixSVGD(0.3, "hessian", mode=mode)
        run = bk.run_particles(log_p, x0, opt, 300)
        assert np.all(np.abs(run.mean - mu) < 0.02 * np.sqrt(np.diag(sigma)))
        np.testing.assert_allclose(np.diag(run.covariance), np.diag(sigma), rtol=0.25)
        corr = run.covariance[0, 1] / np.sqrt(run.covariance[0, 0] * run.covariance[1, 1])
        assert abs(corr - 1.2 / np.sqrt(3.0)) < 0.05
    one = bk.optimizers.MatrixSVGD(0.3, "hessian", mode="mixture")
    bk.run_particles(log_p, x0, one, 1)
    curvature = bk.preconditioners.DenseCurvature.from_matrices(
        tf.constant(np.broadcast_to(np.linalg.inv(sigma), (50, 2, 2)).astype(np.float32))
    )
    _, entropy = matrix_svgd_mixture_direction(
        [tf.constant(x0, tf.float32)], [tf.zeros((50, 2))], bk.kernels.RBF(), curvature, [[0]]
    )
    assert float(one.mixture_weight_entropy) == pytest.approx(float(entropy), rel=1e-5)
    assert 0.0 < float(entropy) < np.log(50)


def test_mixture_needs_two_particles():
    with pytest.raises(ValueError, match="at least 2 particles"):
        bk.run_particles(
            lambda x: -tf.reduce_sum(x**2, 1),
            np.zeros((1, 2)),
            bk.optimizers.MatrixSVGD(0.1, "hessian", mode="mixture"),
            3,
        )
    v = keras.Variable(np.zeros((1, 4), np.float32))
    v.is_particle_variable = True
    with pytest.raises(ValueError, match="at least 2 particles"):
        bk.optimizers.MatrixSVGD(0.1, "identity", mode="mixture").build([v])


def test_nonfinite_curvature_skips_the_update():
    x0 = np.random.default_rng(8).standard_normal((6, 2))
    nan = bk.preconditioners.CallablePreconditioner(lambda x: tf.fill((6, 2, 2), float("nan")))
    opt = bk.optimizers.MatrixSVGD(0.1, nan, mode="mixture", step_rule="rmsprop")
    run = bk.run_particles(lambda x: -tf.reduce_sum(x**2, 1), x0, opt, 4)
    np.testing.assert_array_equal(run.particles, x0.astype(np.float32))
    assert int(opt.skipped_curvature_steps) == 4 and run.skipped_steps == 0
    assert all(
        np.all(s.numpy() == 0) for slots in opt.rule_state for s in slots.values()
    )  # step-rule state untouched
    assert float(opt.mixture_weight_entropy) == 0.0


def test_preconditioner_dimension_mismatch_is_reported():
    x0 = np.random.default_rng(9).standard_normal((4, 2))
    log_p = lambda x: -tf.reduce_sum(x**2, 1)  # noqa: E731
    wrong = bk.preconditioners.CallablePreconditioner(lambda x: tf.eye(3, batch_shape=[4]))
    with pytest.raises(ValueError, match=r"must return \(N, D, D\) = \(4, 2, 2\)"):
        bk.run_particles(log_p, x0, bk.optimizers.MatrixSVGD(0.1, wrong), 2)
    declared = bk.preconditioners.CallablePreconditioner(
        lambda x: tf.eye(3, batch_shape=[4]), dim=3
    )
    with pytest.raises(
        ValueError, match="declared for D = 3 coordinates, but the particles have D = 2"
    ):
        bk.run_particles(log_p, x0, bk.optimizers.MatrixSVGD(0.1, declared), 2)
    # a dense preconditioner cannot serve per-layer kernels
    a, b = keras.Variable(np.ones((4, 2), np.float32)), keras.Variable(np.ones((4, 3), np.float32))
    a.is_particle_variable = b.is_particle_variable = True
    opt = bk.optimizers.MatrixSVGD(
        0.1, bk.preconditioners.CallablePreconditioner(lambda x: x), scope="layer"
    )
    with pytest.raises(ValueError, match="block-diagonal over layers"):
        opt.build([a, b])


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: bk.optimizers.MatrixSVGD(0.1, "hessian", mode="newton"), "mode must be one of"),
        (
            lambda: bk.optimizers.MatrixSVGD(0.1, "hessian", kernel_metric="l1"),
            "kernel_metric must be one of",
        ),
        (
            lambda: bk.optimizers.MatrixSVGD(0.1, "hessian", kernel="centred_linear"),
            "needs a radial kernel",
        ),
        (lambda: bk.optimizers.MatrixSVGD(0.1, "fisher"), "Expected a preconditioner"),
        (
            lambda: bk.preconditioners.HessianPreconditioner(min_eigenvalue=0.0),
            "never invert a raw Hessian",
        ),
        (
            lambda: bk.preconditioners.IdentityPreconditioner(-1.0),
            "scale must be a positive number",
        ),
    ],
)
def test_bad_arguments_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_default_preconditioner_is_kfac_inverted_every_step():
    """MatrixSVGD() needs no arguments (it used to refuse to run without a preconditioner)."""
    pre = bk.optimizers.MatrixSVGD().preconditioner
    assert isinstance(pre, bk.preconditioners.KFACPreconditioner)
    assert (pre.inversion_period, pre.ema_decay) == (1, 0.9)


def _tiny_regression():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((96, 3)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2] + 0.1 * rng.standard_normal((96, 1))).astype(np.float32)
    return x, y


def test_matrix_svgd_through_fit_and_saving(tmp_path):
    """Model door: with Q = I the average mode is SVGD (same weights after fit from the same start);
    the mixture mode trains, reports its weight entropy, and round-trips through .keras."""
    x, y = _tiny_regression()
    weights = None
    results = []
    for opt in [
        bk.optimizers.SVGD(1e-4, step_rule="sgd"),
        bk.optimizers.MatrixSVGD(1e-4, IdentityPreconditioner(), rescaling="none"),
    ]:
        keras.utils.set_random_seed(0)
        model = bk.zoo.mlp(3, 1, (8,), num_particles=4, likelihood=bk.likelihoods.Normal(scale=0.5))
        if weights is None:
            weights = model.get_weights()
        model.set_weights(weights)
        model.compile(optimizer=opt)
        model.fit(x, y, batch_size=32, epochs=3, verbose=0, shuffle=False)
        results.append([v.numpy() for v in model.particle_variables])
        assert np.all(np.abs(results[-1][0]) < 100.0)  # stable
    start = [w for w in weights if w.ndim == 3][0]
    assert np.abs(results[0][0] - start).max() > 1e-3  # moved
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    model = bk.zoo.mlp(3, 1, (8,), num_particles=4, likelihood=bk.likelihoods.Normal(scale=0.1))
    opt = bk.optimizers.MatrixSVGD(
        1e-3,
        IdentityPreconditioner(2.0),
        mode="mixture",
        kernel_metric="euclidean",
        scope="layer",
        mixture_beta=0.5,
        step_rule="rmsprop",
    )
    model.compile(optimizer=opt)
    before = model.evaluate(x, y, verbose=0, return_dict=True)["nll"]
    model.fit(x, y, batch_size=32, epochs=20, verbose=0)
    assert model.evaluate(x, y, verbose=0, return_dict=True)["nll"] < before - 1.0
    assert 0.0 < float(opt.mixture_weight_entropy) <= np.log(4) + 1e-6
    loaded = keras_round_trip(model, tmp_path, "matrix_svgd")
    assert isinstance(loaded.optimizer, bk.optimizers.MatrixSVGD)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert isinstance(loaded.optimizer.preconditioner, IdentityPreconditioner)
    assert loaded.optimizer.preconditioner.scale == 2.0 and loaded.optimizer.mode == "mixture"
    assert float(loaded.optimizer.mixture_weight_entropy) == float(opt.mixture_weight_entropy)
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0)["mean"], model.predict(x, verbose=0)["mean"]
    )
    config = bk.optimizers.MatrixSVGD(
        0.1, bk.preconditioners.HessianPreconditioner(damping=0.1, shrinkage=0.5), mode="mixture"
    ).get_config()
    again = bk.optimizers.MatrixSVGD.from_config(config)
    assert again.get_config() == config and again.preconditioner.shrinkage == 0.5


def test_hessian_preconditioner_needs_a_log_density_outside_the_functional_door():
    v = keras.Variable(np.ones((3, 2), np.float32))
    v.is_particle_variable = True
    with pytest.raises(ValueError, match="has no log density"):
        bk.optimizers.MatrixSVGD(0.1, "hessian").build([v])


def test_preconditioner_is_built_with_one_group_per_layer_whatever_the_kernel_scope():
    """The interface's contract: build(optimizer, view) gets the layer blocks, also when the
    kernel couples all weights (scope='joint')."""
    seen = []

    class Spy(IdentityPreconditioner):
        def build(self, view, add_variable, operators=None):
            super().build(view, add_variable, operators)
            seen.append([list(g) for g in view.layer_blocks])

    model = bk.zoo.mlp(3, 1, (8,), num_particles=4, likelihood=bk.likelihoods.Normal(scale=0.5))
    names = [v.path for v in model.particle_variables]
    for scope in ("joint", "layer"):
        opt = bk.optimizers.MatrixSVGD(1e-3, Spy(), scope=scope)
        model.compile(optimizer=opt)
        opt.build(model.trainable_variables)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert [[names[i] for i in g] for g in seen[0]] == [
        names[:2],
        names[2:],
    ]  # [kernel, bias] per Dense


@pytest.mark.parametrize("mode", ["average", "mixture"])
@pytest.mark.parametrize("metric", ["q", "euclidean"])
def test_declared_curvature_operators_are_the_ones_the_mode_calls(mode, metric):
    """MatrixSVGD.curvature_operators (read by preconditioners at build time: KFAC computes only those)
    covers every Curvature method the step calls, and with the Q metric is exactly that set."""
    called = set()

    class Recording(DenseCurvature):
        pass

    for name in ("apply", "solve", "apply_mean", "solve_mean", "log_det"):

        def method(self, *args, _name=name, **kwargs):
            called.add(_name)
            return getattr(DenseCurvature, _name)(self, *args, **kwargs)

        setattr(Recording, name, method)

    q = _spd(np.random.default_rng(3), N, D)

    class Spy(bk.preconditioners.Preconditioner):
        def update(self, particles, grads, records=(), step=None):
            return Recording.from_matrices(tf.constant(q, tf.float32))

    opt = bk.optimizers.MatrixSVGD(1e-2, Spy(), mode=mode, kernel_metric=metric)
    x0 = np.random.default_rng(4).standard_normal((N, D)).astype(np.float32)
    bk.run_particles(lambda p: -0.5 * tf.reduce_sum(p**2, 1), x0, opt, 2)
    assert called and called <= set(opt.curvature_operators)
    if metric == "q":
        assert called == set(opt.curvature_operators)


def test_shared_weights_step_at_adam_scale_under_a_natural_gradient_learning_rate():
    """MatrixSVGD's SGD learning rate (here 5) scales a preconditioned direction; a shared
    (deterministic) weight must not take Adam steps of that size: the default shared rate is 1e-3."""
    x, y = _tiny_regression()
    inputs = keras.Input((3,))
    h = bk.layers.Dense(4, activation="tanh", deterministic=True, num_particles=4)(inputs)
    out = bk.layers.Dense(1)(h)
    model = bk.BayesianModel(inputs, out, likelihood=bk.likelihoods.Normal(scale=0.5))
    model.compile(
        optimizer=bk.optimizers.MatrixSVGD(5.0, IdentityPreconditioner()), dataset_size=len(x)
    )
    shared = [v for v in model.trainable_variables if not getattr(v, "is_particle_variable", False)]
    before = [v.numpy() for v in shared]
    model.train_on_batch(x[:32], y[:32])
    steps = [np.max(np.abs(v.numpy() - b)) for v, b in zip(shared, before)]
    assert 0 < max(steps) <= 1.1e-3


def test_rescaled_step_of_one_particle_is_newtons_step():
    """rescaling="quadratic" on a Gaussian target with its exact Hessian: one particle has kernel 1 and no
    repulsion, its driving term is Q^-1 grad log p and the quadratic model's step along it is 1, so one step
    at learning rate 1 lands on the mode exactly (Newton's method on a quadratic; the first step's signal
    fraction is 1). Unscaled, the same step is the Newton step too (N = 1); with N = 8 particles the rescaled
    mean moves by the Newton step of the mean to first order, where the unscaled one moves the kernel row sum / N of it (0.38 here)."""
    mu, prec = _gaussian(5)
    p32, m32 = tf.constant(prec, tf.float32), tf.constant(mu, tf.float32)

    def log_p(x):
        z = x - m32
        return -0.5 * tf.reduce_sum(tf.matmul(z, p32) * z, axis=1)

    hess = bk.preconditioners.HessianPreconditioner(min_eigenvalue=1e-3)
    x0 = np.random.default_rng(3).standard_normal((1, 3)).astype(np.float32) * 3.0
    with pytest.warns(UserWarning, match="num_particles=1"):
        run = bk.run_particles(
            log_p, x0, bk.optimizers.MatrixSVGD(1.0, hess, rescaling="quadratic"), 1
        )
    np.testing.assert_allclose(run.particles[0], mu, atol=1e-4)
    cloud = (np.random.default_rng(4).standard_normal((8, 3)) * 0.05 + 4.0).astype(np.float32)
    moved = []
    for rescaling in ("quadratic", "none"):
        run = bk.run_particles(
            log_p, cloud, bk.optimizers.MatrixSVGD(1.0, hess, rescaling=rescaling), 1
        )
        moved.append(
            np.linalg.norm(run.particles.mean(0) - cloud.mean(0))
            / np.linalg.norm(mu - cloud.mean(0))
        )
    assert 0.9 < moved[0] < 1.1 and moved[1] < 0.5, moved  # measured 0.93 and 0.38


def test_rescaling_argument_is_checked_and_serialised():
    with pytest.raises(ValueError, match="rescaling must be one of"):
        bk.optimizers.MatrixSVGD(rescaling="kfac")
    with pytest.raises(ValueError, match="mode='average' only"):
        bk.optimizers.MatrixSVGD(mode="mixture", rescaling="quadratic")
    opt = bk.optimizers.MatrixSVGD(rescaling="none")
    assert bk.optimizers.MatrixSVGD.from_config(opt.get_config()).rescaling == "none"
