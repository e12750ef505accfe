"""GPF against its theorems (Galy-Fajou et al. 2021, "Flexible and Efficient Inference with Particles for the
Variational Gaussian Approximation") on Gaussian targets, via the functional door.

Tolerances: the flows below are run to convergence in float32; the fixed point is exact, so the
remaining error is float32 rounding (~1e-6 relative) and the residual of the geometric convergence
(below 1e-4 at the step counts used, measured), far under the 1e-3 the theorems are checked at.
"""

import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from bayes_keras.optimizers.gaussian_particle_flow import gaussian_entropy, gpf_direction
from conftest import gaussian_target

D, KAPPA = 20, 100.0


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _span_entropy(x):
    """Entropy of the Gaussian of the rows of x on their affine span (numpy, float64): from the
    min(N - 1, D) largest eigenvalues of the covariance."""
    x = np.asarray(x, np.float64)
    z = x - x.mean(0)
    rank = min(x.shape[0] - 1, x.shape[1])
    eig = np.linalg.eigvalsh(z.T @ z / x.shape[0])[-rank:]
    return 0.5 * np.sum(np.log(eig)) + 0.5 * rank * (np.log(2 * np.pi) + 1)


def test_theorem1_d_plus_one_particles_recover_gaussian_exactly():
    mu, sigma, _, log_prob = gaussian_target(D, KAPPA, seed=0)
    x0 = np.random.default_rng(1).standard_normal((D + 1, D))
    # eta = 0.01 as in the paper; stability needs eta * lambda_max(Lambda C) < 2 along the way.
    run = bk.run_particles(
        log_prob, x0, bk.optimizers.GaussianParticleFlow(0.01, step_rule="sgd"), 10000
    )
    assert _rel(run.mean, mu) < 1e-3
    assert _rel(run.covariance, sigma) < 1e-3
    assert run.skipped_steps == 0


def test_theorem3_fewer_particles_give_top_eigenpairs():
    mu, sigma, lam, log_prob = gaussian_target(D, KAPPA, seed=2)
    n = 6
    x0 = np.random.default_rng(3).standard_normal((n, D))
    run = bk.run_particles(
        log_prob, x0, bk.optimizers.GaussianParticleFlow(0.01, step_rule="sgd"), 10000
    )
    eig = np.sort(np.linalg.eigvalsh(run.covariance))[::-1]
    top = np.sort(lam)[::-1][: n - 1]
    np.testing.assert_allclose(eig[: n - 1], top, rtol=1e-3)
    assert np.all(eig[n - 1 :] < 1e-4 * top[-1])  # rank N - 1
    assert _rel(run.mean, mu) < 1e-3  # the mean still converges exactly
    assert abs(np.trace(np.linalg.inv(sigma) @ run.covariance) - (n - 1)) < 1e-3


def test_free_energy_never_increases_at_small_step():
    _, _, _, log_prob = gaussian_target(D, KAPPA, seed=4)
    x0 = np.random.default_rng(5).standard_normal((D + 1, D))
    run = bk.run_particles(
        log_prob, x0, bk.optimizers.GaussianParticleFlow(0.005, step_rule="sgd"), 4000
    )
    f = run.free_energy.astype(np.float64)
    # Allow float32 rounding of F (magnitude |F|, unit roundoff 6e-8, summed over ~D terms).
    tol = 1e-6 * (1.0 + np.abs(f[1:]))
    assert np.all(np.diff(f) <= tol), np.max(np.diff(f))
    assert f[-1] < f[0] - 10.0


def test_free_energy_check_detects_a_too_large_step():
    """Control for the test above: beyond the stability bound the free energy does go up."""
    _, _, _, log_prob = gaussian_target(D, KAPPA, seed=4)
    x0 = np.random.default_rng(5).standard_normal((D + 1, D))
    with pytest.warns(RuntimeWarning):
        run = bk.run_particles(
            log_prob, x0, bk.optimizers.GaussianParticleFlow(0.3, step_rule="sgd"), 200
        )
    f = run.free_energy
    assert not np.all(np.diff(f[np.isfinite(f)]) <= 1e-6 * (1 + np.abs(f[np.isfinite(f)][1:])))


def test_direction_matches_explicit_matrix_form():
    """Delta_i = g_bar + (I - A) ... written with the D x D matrix A = I - (1/N) sum g z^T (Eq. 13)."""
    rng = np.random.default_rng(6)
    n, d = 7, 5
    x, g = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    z = x - x.mean(0)
    a = np.eye(d) - g.T @ z / n
    expected = g.mean(0)[None] - z @ a.T  # x_i <- x_i - eta * (g_bar - A z_i)
    got = gpf_direction([tf.constant(x)], [tf.constant(g)], [[0]])[0].numpy()
    np.testing.assert_allclose(got, expected, atol=1e-12)
    # split across two variables in one block: identical to the single-variable result
    got2 = gpf_direction(
        [tf.constant(x[:, :2]), tf.constant(x[:, 2:])],
        [tf.constant(g[:, :2]), tf.constant(g[:, 2:])],
        [[0, 1]],
    )
    np.testing.assert_allclose(np.concatenate([t.numpy() for t in got2], 1), expected, atol=1e-12)
    # mean field: A diagonal
    a_diag = np.diag(np.diag(a))
    got_mf = gpf_direction([tf.constant(x)], [tf.constant(g)], "mean_field")[0].numpy()
    np.testing.assert_allclose(got_mf, g.mean(0)[None] - z @ a_diag.T, atol=1e-12)
    # mean preconditioning: drift C g_bar, C = Z^T Z / N
    got_pc = gpf_direction([tf.constant(x)], [tf.constant(g)], [[0]], mean_preconditioning=True)[
        0
    ].numpy()
    np.testing.assert_allclose(got_pc, (z.T @ z / n @ g.mean(0))[None] - z @ a.T, atol=1e-12)


def test_entropy_matches_closed_form():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((30, 4)) @ rng.standard_normal((4, 4))
    z = x - x.mean(0)
    c = z.T @ z / 30
    exact = 0.5 * np.linalg.slogdet(2 * np.pi * np.e * c)[1]
    assert abs(float(gaussian_entropy([tf.constant(x)], [[0]])) - exact) < 1e-8
    # blocks: sum of the block entropies
    blocks = float(gaussian_entropy([tf.constant(x[:, :1]), tf.constant(x[:, 1:])], [[0], [1]]))
    e1 = 0.5 * np.log(2 * np.pi * np.e * c[0, 0])
    e2 = 0.5 * np.linalg.slogdet(2 * np.pi * np.e * c[1:, 1:])[1]
    assert abs(blocks - (e1 + e2)) < 1e-8
    # N <= D (the N x N Gram path): the Gaussian on the particles' span, from C's N - 1 nonzero eigenvalues
    xs = x[:3]
    zs = xs - xs.mean(0)
    eig = np.sort(np.linalg.eigvalsh(zs.T @ zs / 3))[-2:]
    exact_span = 0.5 * np.sum(np.log(2 * np.pi * np.e * eig))
    assert abs(float(gaussian_entropy([tf.constant(xs)], [[0]])) - exact_span) < 1e-8


@pytest.mark.parametrize("rule,tol", [("adam", 2e-3), ("rmsprop", 2e-2)])
def test_dimwise_rules_keep_the_exact_fixed_point(rule, tol):
    """A particle-shared diagonal preconditioner keeps the flow affine, so D + 1 particles still
    recover the Gaussian (constant step: residual oscillation of the adaptive rule sets tol)."""
    mu, sigma, _, log_prob = gaussian_target(D, KAPPA, seed=8)
    x0 = np.random.default_rng(9).standard_normal((D + 1, D))
    run = bk.run_particles(
        log_prob, x0, bk.optimizers.GaussianParticleFlow(1e-2, step_rule=rule), 10000
    )
    assert _rel(run.mean, mu) < 1e-3
    assert _rel(run.covariance, sigma) < tol


def test_mean_preconditioning_speeds_up_the_mean():
    mu, sigma, _, log_prob = gaussian_target(D, KAPPA, seed=10)
    x0 = np.random.default_rng(11).standard_normal((D + 1, D))
    plain = bk.run_particles(
        log_prob, x0, bk.optimizers.GaussianParticleFlow(0.01, step_rule="sgd"), 3000
    )
    pre = bk.run_particles(
        log_prob,
        x0,
        bk.optimizers.GaussianParticleFlow(0.01, step_rule="sgd", mean_preconditioning=True),
        3000,
    )
    assert _rel(pre.mean, mu) < 1e-4 < _rel(plain.mean, mu)
    assert _rel(pre.covariance, sigma) < 1e-3


def test_structures_recover_their_targets():
    """Block ("layer") and mean-field flows are exact when the target factorises like them."""
    rng = np.random.default_rng(12)
    var = np.exp(rng.uniform(-1, 1, 6))
    mu = rng.standard_normal(6)

    def log_prob(x):
        return -0.5 * tf.reduce_sum(
            (x - mu.astype(np.float32)) ** 2 / var.astype(np.float32), axis=1
        )

    run = bk.run_particles(
        log_prob,
        rng.standard_normal((4, 6)),
        bk.optimizers.GaussianParticleFlow(0.05, structure="mean_field", step_rule="sgd"),
        3000,
    )
    np.testing.assert_allclose(np.diag(run.covariance), var, rtol=1e-3)
    np.testing.assert_allclose(run.mean, mu, atol=1e-3)


def test_gpf_needs_two_particles():
    with pytest.raises(ValueError, match="at least 2 particles"):
        bk.run_particles(
            lambda x: -tf.reduce_sum(x**2, 1),
            np.zeros((1, 3)),
            bk.optimizers.GaussianParticleFlow(0.1),
            10,
        )


def test_bad_structure_is_rejected():
    with pytest.raises(ValueError, match="structure must be one of"):
        bk.optimizers.GaussianParticleFlow(structure="diag")


@pytest.mark.parametrize(
    "num_particles", [4, 8]
)  # the N x N Gram (N <= D) and the D x D covariance
def test_entropy_of_an_uneven_float32_cloud_is_computed_in_float64(num_particles):
    """A float32 cloud whose spreads differ by 1e5 along rotated axes: its Gram needs float64 (in
    float32 the small eigenvalues were lost to rounding and the free energy collapsed)."""
    rng = np.random.default_rng(0)
    dim = 5
    rotation, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    x = (
        (rng.standard_normal((num_particles, dim)) * np.array([1e3, 10.0, 1.0, 1e-1, 1e-2]))
        @ rotation.T
        + 1.0
    ).astype(np.float32)
    exact = _span_entropy(x)
    for pieces in ([x], [x[:, :2], x[:, 2:]]):  # one variable, or two in one block
        got = float(gaussian_entropy([tf.constant(p) for p in pieces], [list(range(len(pieces)))]))
        assert abs(got - exact) < 1e-4, (got, exact)


@pytest.mark.parametrize("structure", ["full", "layer", "mean_field"])
def test_prepared_cloud_gives_the_free_energy_and_update_of_the_particles(structure):
    """prepare_step computes the particles' centred values, Grams and entropy before the forward pass
    (StepInfo.prepared). The free energy it reports is -mean(log joint) / D minus the closed-form entropy
    of the particles' Gaussian (numpy, from the covariance's nonzero eigenvalues), and the update equals
    the one computed without a prepared step (as a custom loop's apply(grads, variables) does)."""
    import keras

    inputs = keras.Input((3,))
    h = bk.layers.Dense(4, activation="tanh", num_particles=6)(inputs)
    model = bk.BayesianModel(inputs, bk.layers.Dense(2)(h), likelihood="categorical")
    optimizer = bk.optimizers.GaussianParticleFlow(1e-2, structure=structure)
    model.compile(optimizer=optimizer, dataset_size=50)
    optimizer.build(model.trainable_variables)
    flat = [v.numpy().reshape(6, -1).astype(np.float64) for v in model.particle_variables]
    blocks = {
        "full": [np.concatenate(flat, 1)],
        "layer": [np.concatenate(flat[:2], 1), np.concatenate(flat[2:], 1)],
        "mean_field": [c[:, None] for f in flat for c in f.T],
    }[structure]
    entropy = sum(_span_entropy(x) for x in blocks)
    log_likelihood, log_prior = tf.constant(np.linspace(-3, -1, 6), tf.float32), tf.fill((6,), -2.0)
    expected = (-np.mean(log_likelihood.numpy() - 2.0) - entropy) / 50
    updated = []
    for prepared in (optimizer.prepare_step(), None):
        step = bk.optimizers.StepInfo(
            log_likelihood, log_prior, dataset_size=50.0, prepared=prepared
        )
        assert float(optimizer.report(step)["free_energy"]) == pytest.approx(expected, rel=1e-5)
        saved = [v.numpy() for v in model.variables + optimizer.variables]
        grads = [tf.ones_like(v) * 0.1 + tf.cast(v, tf.float32) for v in model.trainable_variables]
        optimizer.apply(grads, model.trainable_variables, step)
        updated.append([v.numpy() for v in model.particle_variables])
        for v, value in zip(model.variables + optimizer.variables, saved):
            v.assign(value)
    for a, b in zip(*updated):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not np.allclose(
        updated[0][0], flat[0].reshape(updated[0][0].shape)
    )  # the update moved them
