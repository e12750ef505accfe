"""PreconditionedParticles: independent particles, each stepped along its own preconditioned gradient."""

import keras

from bayes_keras.core.particle_optimizer import ParticleOptimizer
from bayes_keras.curvature import preconditioners


@keras.saving.register_keras_serializable(package="bayes_keras")
class PreconditionedParticles(ParticleOptimizer):
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
            every step (`bayes_keras.preconditioners.default_preconditioner()`).
        step_rule: "sgd" (default: Q^{-1} already scales the step), "rmsprop", "adam" or a StepRule.

    Example:
        >>> kfac = bayes_keras.preconditioners.KFACPreconditioner(damping=1e-3)
        >>> model.compile(optimizer=bayes_keras.optimizers.PreconditionedParticles(0.5, kfac))
    """

    curvature_operators = ("solve",)

    def __init__(self, learning_rate=0.03, preconditioner=None, step_rule="sgd", **kwargs):
        super().__init__(learning_rate=learning_rate, step_rule=step_rule, **kwargs)
        self.preconditioner = preconditioners.get(preconditioner)

    @property
    def curvature_request(self):
        return self.preconditioner.curvature_request

    def bind_log_prob(self, log_prob_fn):
        self.preconditioner.bind_log_prob(log_prob_fn)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.skipped_curvature_steps = self.add_variable(
            (), dtype="int64", name="skipped_curvature_steps"
        )
        if self.view.variables:
            self.preconditioner.build(self.view, self.add_variable, self.curvature_operators)

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        particles, grads = self.view.flat_particles(), self.view.flat_gradients(grads)
        curvature = self.preconditioner.update(
            particles, grads, preconditioners.step_records(step), iteration
        )
        directions = curvature.solve(grads)
        preconditioners.require_finite_curvature(curvature, self.skipped_curvature_steps, writes)
        self.step_particles(directions, learning_rate, iteration, writes)

    def check_num_particles(self, num_particles):
        super().check_num_particles(num_particles)
        self.warn_if_one_particle(
            num_particles, "is one preconditioned MAP fit (an ensemble of one)"
        )

    def get_config(self):
        config = super().get_config()
        config["preconditioner"] = keras.saving.serialize_keras_object(self.preconditioner)
        return config
