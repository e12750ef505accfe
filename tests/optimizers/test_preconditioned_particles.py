"""PreconditionedParticles: the preconditioners of MatrixSVGD reused by a second optimizer."""

import numpy as np
import pytest

import bayes_keras as bk
from targets import exact_linear_posterior, linear_data, linear_model, linear_particles
from conftest import gaussian_target


def test_hessian_preconditioner_gives_one_newton_step_to_the_mode():
    """On a Gaussian target the exact Hessian is the precision P: at learning rate 1 every particle
    lands on the mean in one step (x - P^-1 P (x - mu) = mu), whatever its start; at 0.5 it halves the
    distance (independent particles: no kernel, no repulsion)."""
    mu, _, _, log_p = gaussian_target(4, 30.0, seed=3)
    x0 = np.random.default_rng(0).standard_normal((5, 4)) * 3.0
    hess = bk.preconditioners.HessianPreconditioner(
        min_eigenvalue=1e-3
    )  # below P's spectrum: no clipping
    one = bk.run_particles(log_p, x0, bk.optimizers.PreconditionedParticles(1.0, hess), 1)
    np.testing.assert_allclose(one.particles, np.tile(mu, (5, 1)), atol=1e-4)
    half = bk.run_particles(
        log_p,
        x0,
        bk.optimizers.PreconditionedParticles(
            0.5, bk.preconditioners.HessianPreconditioner(min_eigenvalue=1e-3)
        ),
        1,
    )
    np.testing.assert_allclose(half.particles - mu, 0.5 * (x0 - mu), atol=1e-4)


def test_kfac_through_fit_reaches_the_map_of_every_member_and_inverts_only_per_particle():
    """Conjugate linear regression: every member's fixed point is the MAP (= the posterior mean); the
    KFAC natural-gradient steps get there within 80 full-batch steps from any start (slowly while a member
    is far away, where its output-gradient factor holds large residuals, then fast: members starting 1.6-2.5
    from the MAP reach it after 25-60 steps, measured over three seeds), and a KFAC object built by this
    optimizer keeps no mean curvature (it only asks for per-particle solves)."""
    x, y = linear_data(n=80, d=3, noise=0.5)
    model = linear_model(3, 4, bk.likelihoods.Normal(scale=0.5))
    kfac = bk.preconditioners.KFACPreconditioner(damping=1e-4, ema_decay=0.0, inversion_period=1)
    model.compile(optimizer=bk.optimizers.PreconditionedParticles(0.5, kfac))
    model.fit(x, y, epochs=80, batch_size=80, verbose=0)
    mean, _ = exact_linear_posterior(x, y, 0.5)
    np.testing.assert_allclose(linear_particles(model), np.tile(mean, (4, 1)), atol=2e-3)
    assert kfac.inverts_per_particle and not kfac.inverts_mean
    assert int(model.optimizer.skipped_curvature_steps.numpy()) == 0


def test_config_round_trip_and_bad_input():
    opt = bk.optimizers.PreconditionedParticles(
        0.3, bk.preconditioners.KFACPreconditioner(damping=1e-2)
    )
    back = bk.optimizers.PreconditionedParticles.from_config(opt.get_config())
    assert back.preconditioner.get_config() == opt.preconditioner.get_config()
    assert float(back.learning_rate) == pytest.approx(0.3)
    default = bk.optimizers.PreconditionedParticles().preconditioner  # no arguments needed: KFAC
    assert (
        isinstance(default, bk.preconditioners.KFACPreconditioner) and default.inversion_period == 1
    )
