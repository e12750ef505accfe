"""MGVBP structure='kronecker': P = A (x) G per layer, against dense linear algebra and a conjugate model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from bayes_keras.inference import mgvbp as core
from test_model import _exact_posterior, _linear_data, _linear_model


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
    scale = core.sample_kronecker(tf.constant(mean), tf.constant(chol_a), tf.constant(chol_g),
                                  tf.eye(p * q, dtype=tf.float64)).numpy() - mean
    np.testing.assert_allclose(scale.T @ scale, np.linalg.inv(precision), rtol=1e-10, atol=1e-14)

    v = rng.standard_normal(p * q)
    np.testing.assert_allclose(core.kronecker_solve(chol_a, chol_g, tf.constant(v)).numpy(),
                               np.linalg.solve(precision, v), rtol=1e-10)

    entropy = 0.5 * p * q * (np.log(2 * np.pi) + 1) - 0.5 * np.linalg.slogdet(precision)[1]
    np.testing.assert_allclose(core.entropy_kronecker(chol_a, chol_g).numpy(), entropy, rtol=1e-12)

    # balancing keeps the product and equalises the mean eigenvalues
    ba, bg = (t.numpy() for t in core.balance_factors(tf.constant(a), tf.constant(g)))
    np.testing.assert_allclose(np.kron(ba, bg), precision, rtol=1e-12)
    np.testing.assert_allclose(np.trace(ba) / p, np.trace(bg) / q, rtol=1e-12)

    # factored damping: (A + pi sqrt(d) I) (x) (G + sqrt(d) / pi I), pi^2 = (tr A / p) / (tr G / q)
    damping = 0.7
    da, dg = (t.numpy() for t in core.damped_kronecker_factors(tf.constant(a), tf.constant(g), damping))
    pi = np.sqrt((np.trace(a) / p) / (np.trace(g) / q))
    expected = np.kron(a + pi * np.sqrt(damping) * np.eye(p), g + np.sqrt(damping) / pi * np.eye(q))
    np.testing.assert_allclose(np.kron(da, dg), expected, rtol=1e-12)
    # ... which is A (x) G + damping I plus the PSD cross terms: never below the exact damped matrix
    assert np.min(np.linalg.eigvalsh(np.kron(da, dg) - precision - damping * np.eye(p * q))) > -1e-9


def test_kronecker_through_fit_recovers_the_posterior_mean_and_the_fisher_factors():
    """Bayesian linear regression, known noise, true Fisher (sampled labels): q's mean is the exact
    posterior mean (E_q[grad log joint] = 0 there, whatever P), and P converges to the damped
    Kronecker factors of the closed-form Fisher: A = mean x~ x~^T, G = n / sigma^2 (one output)."""
    noise, steps = 0.5, 400
    x, y = _linear_data(noise=noise)
    mean, _ = _exact_posterior(x, y, noise)
    model = _linear_model(3, 10, bk.likelihoods.Normal(scale=noise))
    optimizer = bk.optimizers.MGVBP(0.05, mean_learning_rate=0.2, structure="kronecker", curvature="fisher",
                                    seed=1)
    model.compile(optimizer=optimizer)
    history = model.fit(tf.data.Dataset.from_tensors((x, y)).repeat(steps), dataset_size=len(x), verbose=0)
    state = optimizer._state[0]
    mu = state["mean"].numpy()
    assert np.linalg.norm(mu - mean) / np.linalg.norm(mean) < 0.02

    xb = np.concatenate([x, np.ones((len(x), 1))], 1).astype(np.float64)
    a, g = xb.T @ xb / len(x), np.array([[len(x) / noise**2]])
    da, dg = (t.numpy() for t in core.damped_kronecker_factors(tf.constant(a), tf.constant(g), 1.0))
    p = np.kron(state["factor_a"].numpy(), state["factor_g"].numpy())
    np.testing.assert_allclose(p, np.kron(da, dg), rtol=0.05, atol=0.05 * np.max(np.kron(da, dg)))
    assert np.isfinite(history.history["elbo"][-1])

    # posterior(): that Gaussian, flattened and per variable (the bias is the block's last row)
    q = optimizer.posterior()
    np.testing.assert_allclose(q.mean(), mu)
    np.testing.assert_allclose(q.covariance(), np.linalg.inv(p), rtol=1e-6, atol=1e-12)
    kernel, bias = model.particle_variables
    marginals = optimizer.posterior(flatten=False)
    np.testing.assert_allclose(marginals[kernel.path].covariance(), np.linalg.inv(p)[:3, :3], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(marginals[bias.path].covariance(), np.linalg.inv(p)[3:, 3:], rtol=1e-6)


def test_kronecker_conv_net_trains_and_keeps_factors_positive_definite():
    (x, y), (xt, yt) = bk.datasets.load_digits(test_fraction=0.25, seed=0)
    keep, keep_t = y < 3, yt < 3  # three classes: a few seconds
    keras.utils.set_random_seed(0)
    model = bk.zoo.lenet5((8, 8, 1), 3, num_particles=4)
    optimizer = bk.optimizers.MGVBP(2e-3, mean_learning_rate=3e-2, momentum=0.8, structure="kronecker",
                                    curvature="empirical_fisher", initial_precision=1e3, seed=0)
    model.compile(optimizer=optimizer, temperature=0.1)
    model.fit(x[keep], y[keep], epochs=8, batch_size=64, verbose=0)
    probs = model.predict(xt[keep_t], verbose=0)
    assert np.mean(np.argmax(probs, 1) == yt[keep_t]) > 0.9
    for state in optimizer._state:
        for name in ("factor_a", "factor_g"):
            assert np.min(np.linalg.eigvalsh(state[name].numpy())) > 0


def test_kronecker_refuses_what_it_cannot_factor():
    with pytest.raises(ValueError, match="curvature='empirical_fisher' or 'fisher'"):
        bk.optimizers.MGVBP(structure="kronecker")
    inputs = keras.Input((4, 3))
    out = bk.layers.Dense(2)(bk.layers.GRU(5, num_particles=2)(inputs))
    model = bk.BayesianModel(inputs, out, likelihood="categorical")
    with pytest.raises(ValueError, match="Dense and Conv2D.*structure='diagonal'"):
        model.compile(optimizer=bk.optimizers.MGVBP(structure="kronecker", curvature="fisher"))
        model.optimizer.build(model.trainable_variables)
