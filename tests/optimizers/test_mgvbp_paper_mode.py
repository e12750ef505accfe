"""MGVBP.paper() runs the paper's own iteration (Magris, Shabani & Iosifidis, "Manifold Gaussian Variational
Bayes on the Precision Matrix", https://arxiv.org/abs/2210.14598): checked step by step against a NumPy
transcription of the algorithm written here from the paper and the authors' MATLAB code (EMGVB_labour.m:
the estimator on the log likelihood with the Gaussian prior in closed form, their `control_variates`,
`grad_clipping`, `retraction_spd`, `parallel_transport_spd` and step-size rule), independent of the
library's math, on a Bayesian logistic regression (d = 6), full and diagonal precision, in float64, both
fed the same normal draws: the library through `resample(eps)` and `StepInfo.prepared`, the transcription
directly. Samples are theta = mu + L^-T eps with P = L L^T (the authors' UseInvChol = -1 option).
"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy.linalg import solve_triangular, sqrtm

import bayes_keras as bk

FEATURES, SAMPLES, STEPS = 5, 8, 20
BETA, TAU = 0.02, 12  # 8 steps of the 1 / t tail
KERNEL_PRIOR, BIAS_PRIOR = (0.3, 1.5), (-0.2, 2.0)  # (mean, sd)


@pytest.fixture
def float64():
    keras.config.set_floatx("float64")
    keras.mixed_precision.set_global_policy("float64")
    yield
    keras.config.set_floatx("float32")
    keras.mixed_precision.set_global_policy("float32")


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, FEATURES))
    w = rng.standard_normal(FEATURES)
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-(x @ w + 0.5)))).astype(np.float64)
    return x, y


def _model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    logits = bk.layers.Dense(
        1,
        num_particles=SAMPLES,
        kernel_prior=bk.priors.Normal(*KERNEL_PRIOR),
        bias_prior=bk.priors.Normal(*BIAS_PRIOR),
    )(inputs)
    return bk.BayesianModel(inputs, logits, likelihood="bernoulli")


def _draws(seed=1):
    return np.random.default_rng(seed).standard_normal((STEPS + 1, SAMPLES, FEATURES + 1))


def _schedule(t):
    """beta_t = beta for t <= tau, beta tau / t after. Keras evaluates learning-rate schedules in float32
    (bk.schedules.ConstantThenInverseTime as every Keras schedule), so the step sizes are those float32
    numbers; everything else is float64."""
    ratio = np.minimum(np.float32(1.0), np.float32(TAU) / np.float32(t))
    return float(np.float32(BETA) * ratio)


def paper_iteration(
    x, y, mu, eps, diagonal, omega=0.4, p0=10.0, clip=100.0, clip0=None, norms=None
):
    """The paper's algorithm (estimator B) in NumPy, float64; returns [(mu_t, P_t)] for t = 1..len(eps) - 1.
    x (n, k) inputs, the weights [kernel (k,), bias]; eps (T + 1, S, d) the normals of each draw. `norms`: a
    list to which each step's gradient norm before clipping is appended."""
    d, s = len(mu), eps.shape[1]
    xb = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    prior_mean = np.array([KERNEL_PRIOR[0]] * (d - 1) + [BIAS_PRIOR[0]])
    prior_prec = 1.0 / np.array([KERNEL_PRIOR[1]] * (d - 1) + [BIAS_PRIOR[1]]) ** 2
    p = p0 * (np.ones(d) if diagonal else np.eye(d))

    def draw(mu, p, e):
        if diagonal:
            return mu + e / np.sqrt(p)
        chol = np.linalg.cholesky(p)  # p = L L^T; theta = mu + L^-T eps has covariance p^-1
        return mu + solve_triangular(chol.T, e.T, lower=False).T

    def log_likelihood(theta):  # Bernoulli with logits xb theta, summed over the data: (S,)
        z = theta @ xb.T
        return np.sum(y * z - np.logaddexp(0.0, z), axis=1)

    def control_variates(
        a, b
    ):  # the authors' control_variates(A, B, S, 1); MATLAB's var has ddof=1
        return (
            (np.mean(a * b, 0) - np.mean(a, 0) * np.mean(b, 0)) / np.var(b, 0, ddof=1) * s / (s - 1)
        )

    c_mu, c_p = np.zeros(d), np.zeros_like(p)
    m_mu = m_p = zeta = None
    theta = draw(mu, p, eps[0])
    history = []
    for t in range(1, len(eps)):
        f = log_likelihood(theta)
        a = theta - mu
        if diagonal:
            score_p = p - p * a * a * p  # Sig_inv - Sig_inv.*aux.*aux.*Sig_inv, (S, d)
            g_mu = -(1.0 / p) * prior_prec * (mu - prior_mean) + np.mean(a * (f[:, None] - c_mu), 0)
            g_p = (prior_prec - p) + np.mean(score_p * (f[:, None] - c_p), 0)
        else:
            sigma = np.linalg.inv(p)
            pa = a @ p
            score_p = (
                p[None] - pa[:, :, None] * pa[:, None, :]
            )  # Sig_inv - Sig_inv*aux*aux'*Sig_inv
            g_mu = -sigma @ (prior_prec * (mu - prior_mean)) + np.mean(a * (f[:, None] - c_mu), 0)
            g_p = (np.diag(prior_prec) - p) + np.mean(score_p * (f[:, None, None] - c_p), 0)
        fs = f.reshape((-1,) + (1,) * (score_p.ndim - 1))
        c_mu, c_p = control_variates(a * f[:, None], a), control_variates(score_p * fs, score_p)
        bound = clip0 if t == 1 else clip  # grad_clipping on the stacked [g_mu; g_P(:)]
        norm = np.sqrt(np.sum(g_mu**2) + np.sum(g_p**2))
        if norms is not None:
            norms.append(norm)
        if bound is not None and norm > bound:
            g_mu, g_p = g_mu * bound / norm, g_p * bound / norm
        if t == 1:
            m_mu, m_p = g_mu, g_p
        else:
            m_mu = omega * m_mu + (1.0 - omega) * g_mu
            m_p = omega * zeta + (1.0 - omega) * g_p
        beta = _schedule(t)
        mu = mu + beta * m_mu
        step = beta * m_p
        if diagonal:
            new_p = p + step + 0.5 * step * (step / p)
            zeta = (new_p / p) * m_p  # E = (Y.*X_inv).^0.5, zeta = E.^2.*eta
        else:
            new_p = p + step + 0.5 * step @ (sigma @ step)
            new_p = 0.5 * (new_p + new_p.T)
            assert np.all(np.linalg.eigvalsh(new_p) > 0)  # no halving: R_P is positive definite
            e = np.real(sqrtm(new_p @ sigma))  # E = sqrtm(Y*X_inv), zeta = E*eta*E'
            zeta = e @ m_p @ e.T
        p = new_p
        theta = draw(mu, p, eps[t])
        history.append((mu, p))
    return history


def _library_iteration(optimizer, x, y, eps):
    """The optimizer's (mu_t, P_t) for t = 1..len(eps) - 1 through the custom training loop, each step's
    samples drawn from the given normals."""
    model = _model()
    mu0 = np.concatenate(
        [v.numpy()[0].ravel() for v in model.particle_variables]
    )  # q starts at particle 0
    model.compile(optimizer=optimizer)
    model.set_dataset_size(len(x))
    optimizer.build(model.trainable_variables)
    optimizer.resample([tf.constant(eps[0])])
    history = []
    for t in range(1, len(eps)):
        grads, step = model.bayesian_gradients(x, y)
        step = dataclasses.replace(step, prepared=[tf.constant(eps[t])])
        optimizer.apply(grads, model.trainable_variables, step)
        state = optimizer.posterior_blocks[0]
        history.append((state["mean"].numpy(), state["precision"].numpy()))
    return mu0, history


def _relative(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("structure", ["full", "diagonal"])
def test_paper_mode_is_the_papers_iteration_step_by_step(float64, structure):
    x, y = _data()
    eps = _draws()
    optimizer = bk.optimizers.MGVBP.paper(BETA, tau=TAU, structure=structure, seed=0)
    mu0, library = _library_iteration(optimizer, x, y, eps)
    norms = []
    paper = paper_iteration(x, y, mu0, eps, diagonal=structure == "diagonal", norms=norms)
    errors = [max(_relative(m, mp), _relative(p, pp)) for (m, p), (mp, pp) in zip(library, paper)]
    assert max(errors) <= 1e-6, errors  # measured: 1e-15
    # not vacuous: q moved, the first estimate went unclipped above the bound, later ones were clipped
    assert _relative(paper[-1][0], mu0) > 0.1 and _relative(paper[-1][1], paper[0][1]) > 0.1
    assert norms[0] > 100.0 and any(n > 100.0 for n in norms[1:]), norms


def test_the_default_signal_share_and_first_clip_depart_from_the_papers_iteration(float64):
    """The two settings MGVBP.paper() turns off each change the iteration (the transcription sees them)."""
    x, y = _data()
    eps = _draws()
    mu0 = np.concatenate([v.numpy()[0].ravel() for v in _model().particle_variables])
    paper = paper_iteration(x, y, mu0, eps, diagonal=False)
    for change in ({"signal_share": True}, {"initial_gradient_clip": "same"}):
        optimizer = bk.optimizers.MGVBP.paper(BETA, tau=TAU, seed=0, **change)
        _, library = _library_iteration(optimizer, x, y, eps)
        assert _relative(library[-1][1], paper[-1][1]) > 1e-3, change


def test_paper_configuration_round_trips_and_bad_values_are_named():
    optimizer = bk.optimizers.MGVBP.paper(seed=0)
    config = optimizer.get_config()
    assert config["signal_share"] is False and config["initial_gradient_clip"] is None
    assert (
        config["estimator"] == "score"
        and config["structure"] == "full"
        and config["momentum"] == 0.4
    )
    again = bk.optimizers.MGVBP.from_config(config)
    assert again.signal_share is False and again.initial_gradient_clip is None
    # configurations saved before these options load as before: signal shares on, the first step clipped alike
    for key in ("signal_share", "initial_gradient_clip"):
        config.pop(key)
    old = bk.optimizers.MGVBP.from_config(config)
    assert old.signal_share is True and old.initial_gradient_clip == "same"
    with pytest.raises(ValueError, match="signal_share must be True or False; got 'no'"):
        bk.optimizers.MGVBP(signal_share="no")
    with pytest.raises(ValueError, match="initial_gradient_clip"):
        bk.optimizers.MGVBP(initial_gradient_clip=-1.0)
    with pytest.raises(
        ValueError,
        match="MGVBP.paper: the paper's estimators are 'score' and 'score_h'; got "
        "estimator='gradient'",
    ):
        bk.optimizers.MGVBP.paper(estimator="gradient")
    with pytest.raises(
        ValueError,
        match="structure must be 'full', 'layer' or 'diagonal'; got structure='kronecker'",
    ):
        bk.optimizers.MGVBP.paper(structure="kronecker")
    with pytest.raises(ValueError, match="learning_rate is already a schedule"):
        bk.optimizers.MGVBP.paper(bk.schedules.ConstantThenInverseTime(1e-3, 10))
