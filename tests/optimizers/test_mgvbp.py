"""MGVBP: the manifold operations' guarantees, and the exact posterior of a conjugate model through fit."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from bayes_keras.optimizers.gaussian_vi import mgvbp_diagonal
from bayes_keras.optimizers.gaussian_vi import mgvbp_full
from bayes_keras.optimizers.gaussian_vi import precision_manifold as manifold
from targets import (
    assert_sample_moments,
    class_data,
    correlated_linear_data,
    exact_linear_posterior,
    linear_data,
    linear_model,
    paper_mgvbp,
    tiny_classifier,
)


def _random_spd(rng, d, log10_cond):
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    eig = 10.0 ** rng.uniform(0, log10_cond, d) * 10.0 ** rng.uniform(-3, 3)
    return (q * eig) @ q.T


def _random_symmetric(rng, d, scale):
    a = rng.standard_normal((d, d))
    return scale * (a + a.T) / 2


def _is_pd(m):
    try:
        np.linalg.cholesky(m)
        return True
    except np.linalg.LinAlgError:
        return False


# -- manifold operations ---------------------------------------------------------------------------


def test_retraction_keeps_precision_positive_definite_for_any_step():
    """R_P(xi) = 1/2 P + 1/2 (P + xi) P^-1 (P + xi) is PD for every symmetric xi: 3000 random trials
    (sizes 1-40, conditioning up to 1e6, steps up to 1e4 x ||P||), Cholesky succeeds on all; the
    first-order update P + xi on the same trials is not PD in most of them (the test can fail)."""
    rng = np.random.default_rng(0)
    ok, first_order_ok, trials = 0, 0, 0
    for _ in range(300):
        d = int(rng.integers(1, 41))
        p = _random_spd(rng, d, rng.uniform(0, 6))
        for _ in range(10):
            xi = _random_symmetric(rng, d, 10.0 ** rng.uniform(-3, 4) * np.linalg.norm(p, 2))
            new = manifold.retract_full(tf.constant(p), tf.constant(xi)).numpy()
            ok += _is_pd(new)
            first_order_ok += _is_pd(p + xi)
            trials += 1
    assert ok == trials == 3000
    assert first_order_ok < trials / 2


def test_diagonal_retraction_stays_positive_for_any_step():
    rng = np.random.default_rng(1)
    p = 10.0 ** rng.uniform(-6, 6, 200_000)
    xi = rng.standard_normal(200_000) * 10.0 ** rng.uniform(-3, 8, 200_000)
    new = mgvbp_diagonal.retract_diag(tf.constant(p), tf.constant(xi)).numpy()
    assert np.all(new > 0) and np.all(np.isfinite(new))
    assert np.mean(p + xi > 0) < 0.7  # the first-order step would leave the manifold


def test_transport_maps_the_base_point_and_keeps_symmetry():
    rng = np.random.default_rng(2)
    for d in (1, 3, 12):
        p_old, p_new = _random_spd(rng, d, 3), _random_spd(rng, d, 3)
        # T maps P_old to P_new: E P_old E^T = P_new for E = (P_new P_old^-1)^(1/2)
        np.testing.assert_allclose(
            manifold.transport_full(tf.constant(p_old), tf.constant(p_old), tf.constant(p_new)),
            p_new,
            rtol=1e-7,
            atol=1e-9 * np.abs(p_new).max(),
        )
        m = _random_symmetric(rng, d, 1.0)
        tm = manifold.transport_full(tf.constant(m), tf.constant(p_old), tf.constant(p_new)).numpy()
        np.testing.assert_allclose(tm, tm.T)
        np.testing.assert_allclose(
            manifold.transport_full(tf.constant(m), tf.constant(p_old), tf.constant(p_old)),
            m,
            atol=1e-8 * np.abs(m).max(),
        )
    # the diagonal rule is the full transport restricted to diagonal matrices
    a, b, m = 10.0 ** rng.uniform(-2, 2, 5), 10.0 ** rng.uniform(-2, 2, 5), rng.standard_normal(5)
    full = manifold.transport_full(
        tf.constant(np.diag(m)), tf.constant(np.diag(a)), tf.constant(np.diag(b))
    ).numpy()
    np.testing.assert_allclose(np.diag(full), mgvbp_diagonal.transport_diag(m, a, b), rtol=1e-10)


def test_step_halving_finds_a_valid_step_or_keeps_P():
    p = tf.constant(np.diag([1.0, 2.0, 3.0]))

    def first_order(q, xi):  # a retraction that CAN leave the manifold
        return q + xi

    new, factor = manifold.retract_with_halving(
        p, -1.5 * p, first_order, manifold.is_positive_definite_full
    )
    assert float(factor) == 0.5  # P - 1.5 P fails, P - 0.75 P = 0.25 P is PD
    np.testing.assert_allclose(new, 0.25 * p.numpy())
    new, factor = manifold.retract_with_halving(
        p, -1e6 * p, first_order, manifold.is_positive_definite_full, max_halvings=5
    )
    assert float(factor) == 0.0
    np.testing.assert_array_equal(new, p)
    # a valid first try is taken whole
    new, factor = manifold.retract_with_halving(
        p, 0.5 * p, manifold.retract_full, manifold.is_positive_definite_full
    )
    assert float(factor) == 1.0


def test_full_and_diagonal_estimators_agree_on_diagonal_problems():
    """With a diagonal P and independent coordinates, the full estimators' diagonals are the diagonal ones."""
    rng = np.random.default_rng(3)
    d, s = 4, 6
    mean, p = rng.standard_normal(d), 10.0 ** rng.uniform(-1, 1, d)
    theta = mean + rng.standard_normal((s, d)) / np.sqrt(p)
    g = rng.standard_normal((s, d))
    f = rng.standard_normal(s)
    args = [tf.constant(a) for a in (theta, mean)]
    mu_f, p_f = mgvbp_full.reparam_natural_gradient_full(
        *args, tf.constant(np.diag(p)), tf.constant(g)
    )
    mu_d, p_d = mgvbp_diagonal.reparam_natural_gradient_diag(*args, tf.constant(p), tf.constant(g))
    np.testing.assert_allclose(mu_f, mu_d)
    np.testing.assert_allclose(np.diag(p_f.numpy()), p_d)
    zeros = tf.zeros(d, tf.float64)
    mu_f, p_f, *_ = mgvbp_full.score_natural_gradient_full(
        *args,
        tf.constant(np.diag(p)),
        tf.constant(f),
        zeros,
        tf.zeros((d, d), tf.float64),
        zeros,
        tf.ones(d, tf.float64),
    )
    mu_d, p_d, *_ = mgvbp_diagonal.score_natural_gradient_diag(
        *args, tf.constant(p), tf.constant(f), zeros, zeros, zeros, tf.ones(d, tf.float64)
    )
    np.testing.assert_allclose(mu_f, mu_d)
    np.testing.assert_allclose(np.diag(p_f.numpy()), p_d)


# -- the exact posterior through model.fit -----------------------------------------------------------


@pytest.mark.parametrize(
    "estimator,lr,tau,samples,steps",
    [
        ("gradient", 0.1, 300, 100, 5000),
        # the paper's default estimator: log likelihood + closed-form prior (21 s: on demand, -m slow; score_h runs
        # the score-function path in the default suite)
        pytest.param("score", 0.05, 300, 200, 8000, marks=pytest.mark.slow),
        ("score_h", 0.01, 1000, 100, 4000),  # the paper's black-box h-function form
    ],
)
def test_full_recovers_conjugate_posterior(estimator, lr, tau, samples, steps):
    """Bayesian linear regression with known noise: q's optimum is the exact posterior (Gaussian).
    Constant step then beta tau / t (the paper's schedule) lets the Monte Carlo noise average out."""
    noise = 0.5
    x, y = linear_data(noise=noise)
    mean, cov = exact_linear_posterior(x, y, noise)
    precision = np.linalg.inv(cov)
    model = linear_model(3, samples, bk.likelihoods.Normal(scale=noise))
    optimizer = paper_mgvbp(
        bk.schedules.ConstantThenInverseTime(lr, tau), structure="full", estimator=estimator, seed=1
    )
    model.compile(optimizer=optimizer)
    history = model.fit(
        tf.data.Dataset.from_tensors((x, y)).repeat(steps), dataset_size=len(x), verbose=0
    )
    state = optimizer.posterior_blocks[0]
    mu, p = state["mean"].numpy(), state["precision"].numpy()
    assert np.linalg.norm(mu - mean) / np.linalg.norm(mean) < 0.02
    assert np.linalg.norm(p - precision) / np.linalg.norm(precision) < 0.02
    # the reported lower bound is the exact one at the optimum: log evidence / n
    assert np.isfinite(history.history["elbo"][-1])
    # posterior() is that Gaussian
    q = optimizer.posterior()
    np.testing.assert_allclose(q.mean(), mu)
    np.testing.assert_allclose(q.covariance(), np.linalg.inv(p), rtol=1e-8)


def test_diagonal_structure_finds_the_mean_field_optimum():
    """Mean-field optimum of a Gaussian posterior: the exact mean, and precisions equal to the diagonal
    of the posterior PRECISION (correlated inputs make that far from 1 / diag(covariance))."""
    noise = 0.5
    x, y = correlated_linear_data(noise)
    mean, cov = exact_linear_posterior(x, y, noise)
    target = np.diag(np.linalg.inv(cov))
    assert np.max(np.abs(1.0 / np.diag(cov) / target - 1.0)) > 0.3  # the two candidates differ
    model = linear_model(3, 200, bk.likelihoods.Normal(scale=noise))
    # Diagonal preconditioning on a correlated posterior: the mean needs a longer constant phase.
    optimizer = paper_mgvbp(
        bk.schedules.ConstantThenInverseTime(0.1, 2000), structure="diagonal", seed=2
    )
    model.compile(optimizer=optimizer)
    model.fit(tf.data.Dataset.from_tensors((x, y)).repeat(6000), dataset_size=len(x), verbose=0)
    mu, p = (
        optimizer.posterior_blocks[0]["mean"].numpy(),
        optimizer.posterior_blocks[0]["precision"].numpy(),
    )  # one flat block
    assert np.all(np.abs(mu - mean) < 0.05 / np.sqrt(target))  # within 5% of q's own sd
    np.testing.assert_allclose(p, target, rtol=0.05)


# -- robustness and errors -------------------------------------------------------------------------


def test_nonfinite_gradient_never_reaches_mu_or_P():
    x, y = class_data()
    model = tiny_classifier()
    model.compile(optimizer=paper_mgvbp(1e-2, structure="layer"))
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    before = [v.numpy().copy() for v in model.optimizer.posterior_variables]
    x_bad = x.copy()
    x_bad[3, 2] = np.nan
    with pytest.warns(RuntimeWarning, match="skipped"):
        model.fit(x_bad, y, epochs=1, batch_size=64, verbose=0)
    for b, v in zip(before, model.optimizer.posterior_variables):
        np.testing.assert_array_equal(b, v.numpy())


def test_full_structure_on_a_large_model_suggests_block_or_diagonal():
    (x, y), _ = bk.datasets.load_digits(image=True)
    model = bk.zoo.lenet5(num_particles=2)
    model.compile(optimizer=paper_mgvbp(structure="full"))
    with pytest.raises(ValueError, match="structure='layer'.*structure='diagonal'"):
        model.fit(x[:64], y[:64], verbose=0)


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match="structure"):
        paper_mgvbp(structure="kron")
    with pytest.raises(ValueError, match="estimator"):
        paper_mgvbp(estimator="magic")
    with pytest.raises(ValueError, match="momentum"):
        paper_mgvbp(momentum=1.0)
    with pytest.raises(ValueError, match="mean_learning_rate"):
        paper_mgvbp(mean_learning_rate=-0.1)
    with pytest.raises(ValueError, match="curvature"):
        paper_mgvbp(curvature="hessian")
    with pytest.raises(ValueError, match="diagonal"):
        paper_mgvbp(structure="layer", curvature="empirical_fisher")
    with pytest.raises(ValueError, match="estimator='gradient'"):
        paper_mgvbp(estimator="score", curvature="empirical_fisher")


def test_one_sample_is_refused_where_a_sample_covariance_is_needed():
    model = linear_model(3, 1, bk.likelihoods.Normal(scale=0.5))
    with pytest.raises(ValueError, match="at least 2 samples"):
        model.compile(optimizer=paper_mgvbp(1e-2))
    model.compile(optimizer=paper_mgvbp(1e-2, curvature="empirical_fisher"))  # fine with one


def test_empirical_fisher_step_matches_a_hand_computation():
    """One diagonal step with curvature='empirical_fisher' against numpy: the target precision is
    h = n / (B T) * mean_n sum_b g_bn^2 + prior_precision / T with g_bn the per-example gradient of
    -log p(y_b | x_b, w_n); the first step retracts P toward h: p + xi + xi^2 / (2p), xi = beta (h - p)."""
    noise, temperature, beta, p0 = 0.5, 0.5, 0.3, 10.0
    x, y = linear_data(n=40, noise=noise)
    model = linear_model(3, 6, bk.likelihoods.Normal(scale=noise))
    opt = paper_mgvbp(
        beta, structure="diagonal", curvature="empirical_fisher", initial_precision=p0, seed=3
    )
    model.compile(optimizer=opt, dataset_size=len(x), temperature=temperature)
    opt.build(model.trainable_variables)
    k, b = (v.numpy().astype(np.float64) for v in model.particle_variables)  # (N, 3, 1), (N, 1)
    resid = y[None, :] - (np.einsum("bi,ni->nb", x, k[:, :, 0]) + b)  # (N, B)
    g_kernel = (
        -resid[:, :, None] * x[None] / noise**2
    )  # d -log p(y_b) / d w, per particle and example
    g_bias = -resid / noise**2
    scale = len(x) / (len(x) * temperature)  # full batch
    h_kernel = (
        scale * np.mean(np.sum(g_kernel**2, axis=1), axis=0) + 1.0 / temperature
    )  # prior N(0, 1)
    h_bias = scale * np.mean(np.sum(g_bias**2, axis=1), axis=0) + 1.0 / temperature
    model.train_on_batch(x, y)
    h = np.concatenate([h_kernel, [h_bias]])  # the diagonal is one flat block over [kernel, bias]
    xi = beta * (h - p0)
    np.testing.assert_allclose(
        opt.posterior_blocks[0]["precision"].numpy(), p0 + xi + xi**2 / (2 * p0), rtol=1e-4
    )


def test_true_fisher_step_uses_sampled_labels():
    """curvature='fisher' moves P toward the Monte Carlo true Fisher: labels drawn from the model. For a
    linear-Gaussian model E_y~[g^2] = x^2 / sigma^2 whatever the weights, so the target is known in
    closed form; the empirical Fisher at the (untrained) start is far larger (large residuals)."""
    noise, beta, p0 = 0.5, 0.5, 10.0
    x, y = linear_data(n=1000, noise=noise)
    y = y + 5.0  # the untrained model misses by ~5: the empirical Fisher is ~100x the true one
    model = linear_model(3, 6, bk.likelihoods.Normal(scale=noise))
    opt = paper_mgvbp(beta, structure="diagonal", curvature="fisher", initial_precision=p0, seed=3)
    model.compile(optimizer=opt, dataset_size=len(x))
    opt.build(model.trainable_variables)
    k, b = (v.numpy().astype(np.float64) for v in model.particle_variables)
    h_true = np.concatenate([np.sum(x**2, axis=0), [len(x)]]) / noise**2 + 1.0  # + prior N(0, 1)
    resid = y[None, :] - (np.einsum("bi,ni->nb", x, k[:, :, 0]) + b)
    h_empirical = (
        np.concatenate(
            [np.mean(np.einsum("nb,bi->ni", resid**2, x**2), 0), [np.mean(np.sum(resid**2, 1))]]
        )
        / noise**4
        + 1.0
    )
    model.train_on_batch(x, y)
    p = opt.posterior_blocks[0]["precision"].numpy().astype(np.float64)
    # Undo the retraction p = p0 + xi + xi^2 / (2 p0), xi = beta (h - p0), to read off the target h.
    h = p0 + p0 * (np.sqrt(1.0 + 2.0 * (p - p0) / p0) - 1.0) / beta
    # 6 particles x 1000 sampled labels: ~3% Monte Carlo error per coordinate.
    np.testing.assert_allclose(h, h_true, rtol=0.12)
    assert np.all(h < 0.2 * h_empirical)


def test_mean_learning_rate_scales_only_the_mean_step():
    """The first step sets the momentum to the natural gradient: mu moves by mean_learning_rate x
    nat_mu, P by learning_rate (unchanged by the mean's rate)."""
    x, y = class_data()
    steps = {}
    for mlr in (None, 0.05):
        keras.utils.set_random_seed(0)
        model = tiny_classifier(n_particles=4)
        opt = paper_mgvbp(
            1e-2,
            structure="diagonal",
            curvature="empirical_fisher",
            mean_learning_rate=mlr,
            initial_precision=100.0,
            seed=0,
        )
        model.compile(optimizer=opt, dataset_size=len(x))
        opt.build(model.trainable_variables)
        mu0 = opt.posterior_blocks[0]["mean"].numpy()
        model.train_on_batch(x[:64], y[:64])
        steps[mlr] = (
            opt.posterior_blocks[0]["mean"].numpy() - mu0,
            opt.posterior_blocks[0]["precision"].numpy(),
        )
    np.testing.assert_allclose(steps[0.05][0], 5.0 * steps[None][0], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(steps[0.05][1], steps[None][1], rtol=1e-6)
    assert np.max(np.abs(steps[None][0])) > 0
    config = paper_mgvbp(1e-2, mean_learning_rate=0.05).get_config()
    assert bk.optimizers.MGVBP.from_config(config).mean_learning_rate == 0.05


def test_posterior_samples_beyond_the_particles(tmp_path):
    x, y = class_data()
    model = tiny_classifier(n_particles=4)
    model.compile(optimizer=paper_mgvbp(1e-2, structure="diagonal", seed=0))
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    draws = model.optimizer.sample(5000)
    kernel = model.particle_variables[0]
    assert draws[0].shape == (5000,) + tuple(kernel.shape[1:])
    q = model.optimizer.posterior(flatten=False)[kernel.path]
    assert_sample_moments(
        draws[0].numpy().reshape(5000, -1), q.mean(), q.stddev(), what="draws of q"
    )


@pytest.mark.parametrize("structure", ["diagonal", "full"])
def test_overflowing_update_leaves_q_unchanged(structure):
    """Finite but enormous gradients (an exploding network) make the update overflow: q keeps its state
    (the float64 blocks of "full" stay finite, but their samples would overflow the float32 particles)."""
    x, y = class_data()
    model = tiny_classifier()
    optimizer = paper_mgvbp(1e-2, structure=structure)
    model.compile(optimizer=optimizer)
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    before = [v.numpy().copy() for v in optimizer.posterior_variables + model.particle_variables]
    huge = [
        tf.fill(v.shape, tf.constant(np.finfo(np.float32).max / 2, tf.float32))
        for v in model.trainable_variables
    ]
    assert not bool(optimizer.apply(huge, model.trainable_variables))
    assert int(optimizer.skipped_updates.numpy()) == 1
    for b, v in zip(before, optimizer.posterior_variables + model.particle_variables):
        np.testing.assert_array_equal(b, v.numpy())


def test_antithetic_draws_mirror_through_the_mean_and_normals_are_standard():
    from scipy import stats

    for curvature, mirrored in (("empirical_fisher", True), ("stein", False)):
        model = tiny_classifier(n_particles=4)
        opt = paper_mgvbp(1e-2, curvature=curvature, seed=0)
        model.compile(optimizer=opt, dataset_size=64)
        opt.build(model.trainable_variables)
        mu = opt.posterior_blocks[0]["mean"].numpy()
        draws = np.concatenate([d.numpy().reshape(4, -1) for d in opt.sample(4)], 1) - mu
        assert np.allclose(draws[:2], -draws[2:], atol=1e-6) == mirrored
    z = opt._normal(400, [1001])[0].numpy().ravel()  # odd width: the Box-Muller pair is cut
    assert z.shape == (400 * 1001,)
    # Cut into pieces (one per variable), the draw is the same numbers in the same order.
    pieces = opt._normal(400, [3, 497, 2, 499])
    np.testing.assert_array_equal(np.concatenate([p.numpy() for p in pieces], 1).ravel(), z)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert abs(np.mean(z)) < 0.01 and abs(np.std(z) - 1.0) < 0.01
    config = paper_mgvbp(antithetic=False).get_config()
    assert bk.optimizers.MGVBP.from_config(config).antithetic is False


@pytest.mark.parametrize(
    "make",
    [
        lambda: paper_mgvbp(1e-2, seed=3),
        lambda: paper_mgvbp(1e-2, structure="full", seed=3),
        lambda: bk.optimizers.MeanFieldVI(1e-2, seed=3),
    ],
)
def test_fit_samples_are_q_draws_keyed_by_the_counter(make):
    """The normals drawn before the forward pass (prefetch_noise) are those the update would draw itself:
    after fit, the particles are exactly sample() of the updated q under the last step's counter."""
    x, y = class_data()
    model = tiny_classifier()
    optimizer = make()
    model.compile(optimizer=optimizer)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    counter = int(optimizer._sample_counter.numpy())
    assert counter == 1 + 4  # one draw at build, one per step
    optimizer._sample_counter.assign(counter - 1)
    expected = optimizer.sample(optimizer.view.num_particles)
    for v, e in zip(optimizer.view.variables, expected):
        np.testing.assert_allclose(v.numpy(), e.numpy(), rtol=1e-6, atol=1e-7)
    optimizer._sample_counter.assign(counter - 2)  # and the previous key gives different draws
    assert not np.allclose(
        optimizer.sample(optimizer.view.num_particles)[0].numpy(),
        optimizer.view.variables[0].numpy(),
    )


def test_steps_per_execution_draws_the_same_stream():
    """Several steps per compiled call (a tf.while_loop around train_step): each step's prefetched draw
    still reads the counter after the previous step's increment, so q ends exactly where it does with
    one step per call."""
    x, y = class_data()
    finals = []
    for steps in (1, 4):
        keras.utils.set_random_seed(0)
        model = tiny_classifier()
        optimizer = paper_mgvbp(1e-2, seed=3)
        model.compile(optimizer=optimizer, steps_per_execution=steps)
        model.fit(x, y, epochs=2, batch_size=8, verbose=0, shuffle=False)
        finals.append([v.numpy() for v in optimizer.posterior_variables + optimizer.view.variables])
    assert int(optimizer._sample_counter.numpy()) == 1 + 16
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)


def test_prepared_normals_are_the_draw_the_update_would_make():
    """The normals of prepare_step (handed back in StepInfo.prepared) are those the update draws itself when
    called without a step: same counter, same particles."""
    x, y = class_data()
    model = tiny_classifier()
    optimizer = paper_mgvbp(1e-2, seed=3)
    model.compile(optimizer=optimizer)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    saved = [v.numpy() for v in optimizer.variables + model.variables]
    grads = [tf.zeros_like(v) for v in model.trainable_variables]
    step = bk.optimizers.StepInfo(tf.zeros(4), tf.zeros(4), prepared=optimizer.prepare_step())
    optimizer.apply(grads, model.trainable_variables, step)
    with_step = [v.numpy() for v in model.particle_variables]
    for v, value in zip(optimizer.variables + model.variables, saved):
        v.assign(value)
    optimizer.apply(grads, model.trainable_variables)
    for a, b in zip(with_step, model.particle_variables):
        np.testing.assert_array_equal(a, b.numpy())
