"""PreconditionedOptimizer: the plumbing between a particle optimizer and a curvature preconditioner.

Any optimizer whose direction uses a `bayes_keras.preconditioners.Preconditioner` derives from it:
it forwards the preconditioner's curvature request and the model's captured curvature, builds the
preconditioner with the particle shapes and layer groups, binds a log density for the functional door,
and skips a step whose curvature or direction is not finite (particles and step-rule state untouched,
counted in `skipped_curvature_steps`). Subclasses implement `_direction_and_status` and declare the
`Curvature` methods they call in `curvature_operators` (KFAC computes only those).
"""

import keras
import numpy as np
import tensorflow as tf

from bayes_keras import preconditioners as preconditioners_lib
from bayes_keras.optimizers.particle_optimizer import ParticleOptimizer, is_particle_variable


class PreconditionedOptimizer(ParticleOptimizer):
    """Base class; see the module docstring. `preconditioner`: a Preconditioner or its name."""

    curvature_operators = ("apply", "solve", "apply_mean", "solve_mean", "log_det")

    def __init__(self, learning_rate, preconditioner, step_rule="sgd", **kwargs):
        if preconditioner is None:
            raise ValueError(f"{type(self).__name__} needs a preconditioner, e.g. bayes_keras.preconditioners."
                             "HessianPreconditioner() (functional door) or a KFAC preconditioner.")
        super().__init__(learning_rate=learning_rate, step_rule=step_rule, **kwargs)
        self.preconditioner = preconditioners_lib.get(preconditioner)

    # -- contract with the model / functional door ---------------------------------------------
    @property
    def curvature_request(self):
        return getattr(self.preconditioner, "curvature_request", None)

    def observe_curvature(self, records):
        self.preconditioner.observe_curvature(records)

    def bind_log_prob(self, log_prob_fn):
        """Called by bayes_keras.inference.run_particles: lets a HessianPreconditioner see the density."""
        if hasattr(self.preconditioner, "bind_log_prob"):
            self.preconditioner.bind_log_prob(log_prob_fn)

    # -- build / step --------------------------------------------------------------------------
    def build(self, variables):
        if self.built:
            return
        pvars = [v for v in variables if is_particle_variable(v)]
        if pvars:
            self.check_num_particles(int(pvars[0].shape[0]))
        super().build(variables)
        self._build_own_variables()
        self.skipped_curvature_steps = self.add_variable((), dtype="int64", name="skipped_curvature_steps")
        if pvars:
            shapes = [(int(v.shape[0]), int(np.prod(v.shape[1:]))) for v in pvars]
            layer_groups = self._groups_for(pvars)
            self.preconditioner.build(self, shapes, layer_groups)  # the interface's groups: one per layer
            self._check_preconditioner(self.preconditioner.blocks(len(pvars)), layer_groups)

    def _build_own_variables(self):
        """A subclass's optimizer variables (created before the preconditioner's)."""

    def check_num_particles(self, num_particles):
        if num_particles < 1:
            raise ValueError(f"{type(self).__name__} needs at least one particle; got {num_particles}.")

    def _check_preconditioner(self, blocks, layer_groups):
        """Raise if the preconditioner's blocks (index lists, or None: diagonal) do not fit this optimizer's
        structure (default: anything fits)."""

    def direction(self, particles, grads, groups):
        return self._direction_and_status(particles, grads, groups)[0]

    def _direction_and_status(self, particles, grads, groups):
        """(directions, finite, extra) for the flattened particles and gradients of the NEGATIVE log joint;
        `extra` is handed to `_after_step` when the step is applied."""
        raise NotImplementedError

    def _after_step(self, extra):
        """Bookkeeping of an applied step (e.g. MatrixSVGD's mixture-weight entropy)."""

    def _update_particles(self, pvars, grads, slots, learning_rate, step):
        directions, finite, extra = self._direction_and_status(*self._flat_particles(pvars, grads),
                                                               self._groups_for(pvars))
        for d in directions:
            finite = finite & tf.reduce_all(tf.math.is_finite(d))

        def apply():
            self._step_particles(directions, pvars, slots, learning_rate, step)
            self._after_step(extra)
            return tf.constant(True)

        def skip():
            self.skipped_curvature_steps.assign_add(1)
            return tf.constant(False)

        tf.cond(finite, apply, skip)

    def get_config(self):
        config = super().get_config()
        config["preconditioner"] = keras.saving.serialize_keras_object(self.preconditioner)
        return config
