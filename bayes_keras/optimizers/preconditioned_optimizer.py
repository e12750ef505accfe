"""PreconditionedOptimizer: the plumbing between a particle optimizer and a curvature preconditioner.

Any optimizer whose direction uses a `bayes_keras.preconditioners.Preconditioner` derives from it:
it forwards the preconditioner's curvature request and the step's captured curvature (StepInfo.curvature),
builds the preconditioner with the optimizer's ParticleView, binds a log density for the functional door,
and skips a step whose curvature or direction is not finite (particles and step-rule state untouched,
counted in `skipped_curvature_steps` as well as `skipped_updates`). Subclasses implement
`preconditioned_direction` and declare the `Curvature` methods they call in `curvature_operators` (KFAC
computes only those).
"""

import keras
import tensorflow as tf

from bayes_keras import preconditioners as preconditioners_lib
from bayes_keras.core.particle_optimizer import ParticleOptimizer


def default_preconditioner():
    """The preconditioner of MatrixSVGD() and PreconditionedParticles(): KFAC inverted every step with a
    short running average (decay 0.9), so that the curvature follows particles that move fast. With
    KFACPreconditioner's own schedule (inversions every 20 steps, decay 0.95) a natural-gradient step
    of 0.03-0.1 on the digits MLP diverged: the stale curvature lagged the particles
    (benchmarks/defaults.py)."""
    return preconditioners_lib.KFACPreconditioner(ema_decay=0.9, inversion_period=1)


class PreconditionedOptimizer(ParticleOptimizer):
    """Base class; see the module docstring. `preconditioner`: a Preconditioner or its name; None: the
    default, `default_preconditioner()` (KFAC, inverted every step)."""

    curvature_operators = ("apply", "solve", "apply_mean", "solve_mean", "log_det")

    def __init__(self, learning_rate, preconditioner=None, step_rule="sgd", **kwargs):
        super().__init__(learning_rate=learning_rate, step_rule=step_rule, **kwargs)
        self.preconditioner = default_preconditioner() if preconditioner is None else preconditioners_lib.get(preconditioner)

    # -- contract with the model / functional door ---------------------------------------------
    @property
    def curvature_request(self):
        return self.preconditioner.curvature_request

    def bind_log_prob(self, log_prob_fn):
        """Called by bayes_keras.run_particles: lets a HessianPreconditioner see the density."""
        self.preconditioner.bind_log_prob(log_prob_fn)

    # -- build / step --------------------------------------------------------------------------
    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._build_own_variables()
        self.skipped_curvature_steps = self.add_variable((), dtype="int64", name="skipped_curvature_steps")
        if self.view.variables:
            self.preconditioner.build(self, self.view)  # the interface's groups: one per layer
            self._check_preconditioner(self.preconditioner.blocks(len(self.view)), self.view.layer_groups)

    def _build_own_variables(self):
        """A subclass's optimizer variables (created before the preconditioner's)."""

    def _check_preconditioner(self, blocks, layer_groups):
        """Raise if the preconditioner's blocks (index lists, or None: diagonal) do not fit this optimizer's
        structure (default: anything fits)."""

    def preconditioned_direction(self, particles, grads, groups, records):
        """(directions, finite, extra) for the flattened particles and gradients of the NEGATIVE log joint
        and the step's curvature records; `extra` is handed to `_after_step` with the step's writes."""
        raise NotImplementedError

    def _after_step(self, extra, writes):
        """Bookkeeping of a step (e.g. MatrixSVGD's mixture-weight entropy), through `writes`."""

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        particles = self.view.flatten([v.value for v in self.view.variables])
        flat_grads = self.view.flatten([tf.cast(g, v.dtype) for g, v in zip(grads, self.view.variables)])
        records = () if step is None else step.curvature
        directions, finite, extra = self.preconditioned_direction(particles, flat_grads, self.view.layer_groups, records)
        # A non-finite curvature skips the whole update (the guard in BayesianOptimizer.apply), counted here too.
        self.skipped_curvature_steps.assign_add(tf.where(finite, tf.constant(0, tf.int64), tf.constant(1, tf.int64)))
        writes.require(finite)
        self.step_particles(directions, learning_rate, iteration, writes)
        self._after_step(extra, writes)

    def get_config(self):
        config = super().get_config()
        config["preconditioner"] = keras.saving.serialize_keras_object(self.preconditioner)
        return config
