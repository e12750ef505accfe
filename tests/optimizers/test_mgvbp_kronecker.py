"""MGVBP structure='kronecker': P = A (x) G per layer, against dense linear algebra and a conjugate model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from bayes_keras.optimizers.gaussian_vi import mgvbp_kronecker
from targets import exact_linear_posterior, linear_data, linear_model, paper_mgvbp


def _spd(rng, d):
    m = rng.standard_normal((d, d))
    return m @ m.T + d * np.eye(d)


def test_kronecker_primitives_match_dense_algebra():
    rng = np.random.default_rng(0)
    p, q = 4, 3
    a, g = _spd(rng, p), _spd(rng, q)
    precision = np.kron(a, g)  # row-major vec of a (p, q) matrix
    chol_a, chol_g = np.linalg.cholesky(a), np.linalg.cholesky(g)
    mean = rng.standard_normal(p * q)

    # sample: theta - mu = S eps with S S^T = P^-1 (feed the unit vectors to read S off)
    scale = (
        mgvbp_kronecker.sample_kronecker(
            tf.constant(mean),
            tf.constant(chol_a),
            tf.constant(chol_g),
            tf.eye(p * q, dtype=tf.float64),
        ).numpy()
        - mean
    )
    np.testing.assert_allclose(scale.T @ scale, np.linalg.inv(precision), rtol=1e-10, atol=1e-14)

    v = rng.standard_normal(p * q)
    np.testing.assert_allclose(
        mgvbp_kronecker.kronecker_solve(chol_a, chol_g, tf.constant(v)).numpy(),
        np.linalg.solve(precision, v),
        rtol=1e-10,
    )

    entropy = 0.5 * p * q * (np.log(2 * np.pi) + 1) - 0.5 * np.linalg.slogdet(precision)[1]
    np.testing.assert_allclose(
        mgvbp_kronecker.entropy_kronecker(chol_a, chol_g).numpy(), entropy, rtol=1e-12
    )

    # balancing keeps the product and equalises the mean eigenvalues
    ba, bg = (t.numpy() for t in mgvbp_kronecker.balance_factors(tf.constant(a), tf.constant(g)))
    np.testing.assert_allclose(np.kron(ba, bg), precision, rtol=1e-12)
    np.testing.assert_allclose(np.trace(ba) / p, np.trace(bg) / q, rtol=1e-12)


def _nearest_kronecker_product(m, p, q):
    """Brute force: the best rank-1 approximation of the rearranged (p^2, q^2) matrix (Van Loan)."""
    r = m.reshape(p, q, p, q).transpose(0, 2, 1, 3).reshape(p * p, q * q)
    u, s, vt = np.linalg.svd(r)
    return s[0] * np.outer(u[:, 0], vt[0]).reshape(p, p, q, q).transpose(0, 2, 1, 3).reshape(
        p * q, p * q
    )


@pytest.mark.parametrize("seed", range(5))
def test_damped_factors_are_the_nearest_kronecker_product_of_the_damped_curvature(seed):
    rng = np.random.default_rng(seed)
    p, q = 4, 3
    a, g = _spd(rng, p) * 10.0 ** rng.uniform(-2, 2), _spd(rng, q)
    a[0, :] = a[:, 0] = 0.0  # a coordinate the data never excites
    damping = 0.7
    target = np.kron(a, g) + damping * np.eye(p * q)
    da, dg = (
        t.numpy()
        for t in mgvbp_kronecker.damped_kronecker_factors(tf.constant(a), tf.constant(g), damping)
    )
    np.testing.assert_allclose(
        np.kron(da, dg),
        _nearest_kronecker_product(target, p, q),
        rtol=1e-7,
        atol=1e-7 * np.abs(target).max(),
    )
    assert np.min(np.linalg.eigvalsh(np.kron(da, dg))) > 0
    np.testing.assert_allclose(np.trace(da) / p, np.trace(dg) / q, rtol=1e-12)  # balanced
    # a 1 x 1 factor: the damped curvature is itself a Kronecker product, recovered exactly
    g1 = np.array([[2.5]])
    da, dg = (
        t.numpy()
        for t in mgvbp_kronecker.damped_kronecker_factors(tf.constant(a), tf.constant(g1), damping)
    )
    np.testing.assert_allclose(
        np.kron(da, dg), 2.5 * a + damping * np.eye(p), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("seed", range(3))
def test_row_damping_gives_the_nearest_kronecker_product(seed):
    """Each row its own prior precision (kernel rows, bias row): A (x) G + diag(d) (x) I, brute force."""
    rng = np.random.default_rng(seed)
    p, q = 5, 3
    a, g = _spd(rng, p) * 10.0 ** rng.uniform(-2, 2), _spd(rng, q)
    rows = np.array(
        [0.7, 0.7, 0.7, 0.7, 11.0]
    )  # a bias prior of sd 0.3 against kernel priors of sd 1.2
    target = np.kron(a, g) + np.kron(np.diag(rows), np.eye(q))
    da, dg = (
        t.numpy()
        for t in mgvbp_kronecker.damped_kronecker_factors(
            tf.constant(a), tf.constant(g), tf.constant(rows)
        )
    )
    np.testing.assert_allclose(
        np.kron(da, dg),
        _nearest_kronecker_product(target, p, q),
        rtol=1e-7,
        atol=1e-7 * np.abs(target).max(),
    )
    g1 = np.array([[2.5]])  # one output: exact
    da, dg = (
        t.numpy()
        for t in mgvbp_kronecker.damped_kronecker_factors(
            tf.constant(a), tf.constant(g1), tf.constant(rows)
        )
    )
    np.testing.assert_allclose(np.kron(da, dg), 2.5 * a + np.diag(rows), rtol=1e-12, atol=1e-12)


def test_kronecker_uses_the_bias_prior_of_the_bias_row():
    """Conjugate linear regression with a bias prior (sd 0.3) unlike the kernel's (sd 1) and noisy data, so
    that the prior weighs on the bias: q's marginal sds are the exact posterior's (they were 1.5x with the
    kernel's prior on every row)."""
    noise, steps = 3.0, 400
    x, y = linear_data(noise=noise)
    xb = np.concatenate([x, np.ones((len(x), 1))], 1).astype(np.float64)
    cov = np.linalg.inv(xb.T @ xb / noise**2 + np.diag([1.0, 1.0, 1.0, 1.0 / 0.3**2]))
    inputs = keras.Input((3,))
    out = bk.layers.Dense(1, num_particles=10, kernel_prior=1.0, bias_prior=0.3)(inputs)
    model = bk.BayesianModel(
        inputs, out, likelihood=bk.likelihoods.Normal(scale=noise, standardize=False)
    )
    optimizer = paper_mgvbp(
        0.05, mean_learning_rate=0.2, structure="kronecker", curvature="fisher", seed=1
    )
    model.compile(optimizer=optimizer)
    model.fit(tf.data.Dataset.from_tensors((x, y)).repeat(steps), dataset_size=len(x), verbose=0)
    sds = np.sqrt(np.diag(optimizer.posterior().covariance().numpy()))
    np.testing.assert_allclose(sds, np.sqrt(np.diag(cov)), rtol=0.05)


def test_kronecker_through_fit_recovers_the_exact_posterior_of_a_conjugate_model():
    """Bayesian linear regression, known noise, true Fisher (sampled labels). One output makes G 1 x 1,
    so the posterior precision X~^T X~ / sigma^2 + I is a Kronecker product and q's optimum is the exact
    posterior: mean (E_q[grad log joint] = 0 there, whatever P), precision, and marginal sds, including
    those of a feature that is always zero (no data: the prior's sd 1)."""
    noise, steps = 0.5, 400
    x, y = linear_data(noise=noise)
    x = np.concatenate([x, np.zeros((len(x), 1), np.float32)], 1)  # an unexcited fourth weight
    mean, cov = exact_linear_posterior(x, y, noise)
    model = linear_model(4, 10, bk.likelihoods.Normal(scale=noise))
    optimizer = paper_mgvbp(
        0.05, mean_learning_rate=0.2, structure="kronecker", curvature="fisher", seed=1
    )
    model.compile(optimizer=optimizer)
    history = model.fit(
        tf.data.Dataset.from_tensors((x, y)).repeat(steps), dataset_size=len(x), verbose=0
    )
    assert np.isfinite(history.history["elbo"][-1])
    q = optimizer.posterior()
    mu, q_cov = q.mean().numpy(), q.covariance().numpy()
    assert np.linalg.norm(mu - mean) / np.linalg.norm(mean) < 0.02
    # P's target is an unbiased Monte Carlo estimate (one sampled label per example and sample) that the
    # retraction averages with step 0.05: a few percent of noise remain.
    np.testing.assert_allclose(
        np.linalg.inv(q_cov),
        np.linalg.inv(cov),
        rtol=0.05,
        atol=0.05 * np.abs(np.linalg.inv(cov)).max(),
    )
    np.testing.assert_allclose(np.sqrt(np.diag(q_cov)), np.sqrt(np.diag(cov)), rtol=0.03)
    assert abs(np.sqrt(q_cov[3, 3]) - 1.0) < 0.03  # the unexcited weight keeps the prior's sd

    # posterior(flatten=False): the same Gaussian's marginals per variable (the bias is the last row)
    kernel, bias = model.particle_variables
    marginals = optimizer.posterior(flatten=False)
    np.testing.assert_allclose(
        marginals[kernel.path].covariance(), q_cov[:4, :4], rtol=1e-6, atol=1e-12
    )
    np.testing.assert_allclose(marginals[bias.path].covariance(), q_cov[4:, 4:], rtol=1e-6)


def test_kronecker_conv_net_trains_and_keeps_factors_positive_definite():
    (x, y), (xt, yt) = bk.datasets.load_digits(test_fraction=0.25, seed=0)
    keep, keep_t = y < 3, yt < 3  # three classes: a few seconds
    keras.utils.set_random_seed(0)
    model = bk.zoo.lenet5((8, 8, 1), 3, num_particles=4)
    optimizer = paper_mgvbp(
        2e-3,
        mean_learning_rate=3e-2,
        momentum=0.8,
        structure="kronecker",
        curvature="empirical_fisher",
        initial_precision=1e3,
        seed=0,
    )
    model.compile(optimizer=optimizer, temperature=0.1)
    model.fit(x[keep], y[keep], epochs=8, batch_size=64, verbose=0)
    probs = model.predict(xt[keep_t], verbose=0)
    assert np.mean(np.argmax(probs, 1) == yt[keep_t]) > 0.9
    for state in optimizer.posterior_blocks:
        for name in ("factor_a", "factor_g"):
            assert np.min(np.linalg.eigvalsh(state[name].numpy())) > 0


def test_kronecker_refuses_what_it_cannot_factor():
    with pytest.raises(ValueError, match="curvature='empirical_fisher' or 'fisher'"):
        paper_mgvbp(structure="kronecker")
    inputs = keras.Input((4, 3))
    out = bk.layers.Dense(2)(bk.layers.GRU(5, num_particles=2)(inputs))
    model = bk.BayesianModel(inputs, out, likelihood="categorical")
    with pytest.raises(ValueError, match="Dense, Conv1D and Conv2D.*structure='diagonal'"):
        model.compile(optimizer=paper_mgvbp(structure="kronecker", curvature="fisher"))
        model.optimizer.build(model.trainable_variables)


@pytest.mark.parametrize("structure", ["kronecker", "layer"])
def test_posterior_over_several_blocks_has_the_blocks_standard_deviations(structure):
    """posterior() over one block per layer: its stddev() / variance() are each block's, from the
    covariance the state defines (numpy: inv(A) (x) inv(G) for a Kronecker block, inv(P) for a full one)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    model = bk.zoo.mlp(4, 2, (8,), num_particles=3)
    curvature = "empirical_fisher" if structure == "kronecker" else "stein"
    optimizer = bk.optimizers.MGVBP(structure=structure, curvature=curvature, seed=0)
    model.compile(optimizer=optimizer, likelihood="categorical", dataset_size=64)
    model.fit(x, y, epochs=2, verbose=0)
    expected = []
    for block in optimizer.posterior_blocks:
        if structure == "kronecker":
            cov = np.kron(
                np.linalg.inv(block["factor_a"].numpy()), np.linalg.inv(block["factor_g"].numpy())
            )
        else:
            cov = np.linalg.inv(block["precision"].numpy())
        expected.append(np.sqrt(np.diag(cov)))
    expected = np.concatenate(expected)
    q = optimizer.posterior()
    assert len(optimizer.posterior_blocks) == 2
    np.testing.assert_allclose(q.stddev().numpy(), expected, rtol=1e-8)
    np.testing.assert_allclose(q.variance().numpy(), expected**2, rtol=1e-8)
    assert q.sample(3).shape == (3, expected.size)
