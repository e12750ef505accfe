"""What an optimizer that uses a Preconditioner composes (MatrixSVGD, PreconditionedParticles): the default
preconditioner, the lookup of a given one, and the skip of a step whose curvature is not finite."""

import tensorflow as tf

from bayes_keras._config import resolve
from bayes_keras.curvature.preconditioners.base import Preconditioner
from bayes_keras.curvature.preconditioners.dense import HessianPreconditioner
from bayes_keras.curvature.preconditioners.identity import IdentityPreconditioner
from bayes_keras.curvature.preconditioners.kfac_preconditioner import KFACPreconditioner

_NAMES = {
    "hessian": HessianPreconditioner,
    "identity": IdentityPreconditioner,
    "kfac": KFACPreconditioner,
}


def get(identifier):
    """A Preconditioner from an instance, a name ("hessian", "identity", "kfac") or a serialized config;
    None: `default_preconditioner()`."""
    return resolve(
        identifier,
        Preconditioner,
        _NAMES,
        "a preconditioner (a bayes_keras.preconditioners.Preconditioner",
        default=default_preconditioner,
    )


def default_preconditioner():
    """The preconditioner of MatrixSVGD() and PreconditionedParticles(): KFAC inverted every step with a
    short running average (decay 0.9), so that the curvature follows particles that move fast. With
    KFACPreconditioner's own schedule (inversions every 20 steps, decay 0.95) a natural-gradient step
    of 0.03-0.1 on the digits MLP diverged: the stale curvature lagged the particles
    (benchmarks/defaults.py)."""
    return KFACPreconditioner(ema_decay=0.9, inversion_period=1)


def step_records(step):
    """The step's captured curvature records (none for a custom loop's apply without a StepInfo)."""
    return () if step is None else step.curvature


def require_finite_curvature(curvature, skipped_curvature_steps, writes):
    """A step whose curvature (or direction through it) is not finite writes nothing (the guard in
    BayesianOptimizer.apply); it is counted in `skipped_curvature_steps` as well as `skipped_updates`."""
    finite = curvature.is_finite()
    skipped_curvature_steps.assign_add(
        tf.where(finite, tf.constant(0, tf.int64), tf.constant(1, tf.int64))
    )
    writes.require(finite)
