"""PreconditionedParticles: independent particles, each stepped along its own preconditioned gradient."""

import keras

from bayes_keras.optimizers.preconditioned_optimizer import PreconditionedOptimizer


@keras.saving.register_keras_serializable(package="bayes_keras")
class PreconditionedParticles(PreconditionedOptimizer):
    """Each particle steps along Q_l^{-1} grad log p(w_l | D), with Q_l its own curvature from a
    `bayes_keras.preconditioners` object: with `KFACPreconditioner` an ensemble of K-FAC
    natural-gradient MAP fits ("Optimizing Neural Networks with Kronecker-factored Approximate
    Curvature", Martens & Grosse, ICML 2015, https://arxiv.org/abs/1503.05671: the update of its Sec. 6
    without the rescaling and momentum of Sec. 7) run as one vectorised model, with
    `HessianPreconditioner` (functional door) damped Newton per particle. The particles do not
    interact: MatrixSVGD without the kernel. The preconditioner objects are the ones MatrixSVGD uses
    (same interface, same saved state); this optimizer asks only for per-particle solves, so KFAC
    skips the mean curvature.

    Args:
        learning_rate: step size (float or schedule); 1 is a full natural-gradient / Newton step.
            Default 0.03 (with the default KFAC; a full step suits exact Hessians of smooth targets).
        preconditioner: a Preconditioner (or "hessian" / "identity"); None (default): KFAC inverted
            every step (`bayes_keras.optimizers.preconditioned_optimizer.default_preconditioner`).
        step_rule: "sgd" (default: Q^{-1} already scales the step), "rmsprop", "adam" or a StepRule.

    Example:
        >>> kfac = bayes_keras.preconditioners.KFACPreconditioner(damping=1e-3)
        >>> model.compile(optimizer=bayes_keras.optimizers.PreconditionedParticles(0.5, kfac))
    """

    curvature_operators = ("solve",)

    def __init__(self, learning_rate=0.03, preconditioner=None, step_rule="sgd", **kwargs):
        super().__init__(learning_rate=learning_rate, preconditioner=preconditioner, step_rule=step_rule, **kwargs)

    def preconditioned_direction(self, particles, grads, groups, records):
        curvature = self.preconditioner.update(particles, grads, records)
        return curvature.solve(grads), curvature.is_finite(), None

    def check_num_particles(self, num_particles):
        super().check_num_particles(num_particles)
        self.warn_if_one_particle(num_particles, "is one preconditioned MAP fit (an ensemble of one)")
