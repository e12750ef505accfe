"""ParticleOptimizer: the base of methods that move the particles themselves (GPF, SVGD, MatrixSVGD, ensembles).

It splits the gradients into particle variables (leading axis N) and shared (deterministic)
variables, asks the method for a direction over all particle variables jointly (`direction`), turns
directions into steps with a step rule whose state lives in optimizer variables (`RuleState`), and
updates shared variables with an element-wise Adam. Every new value goes through the base class's
guarded write (`BayesianOptimizer.apply`).
"""

import keras
import tensorflow as tf

from bayes_keras._config import check_number
from bayes_keras.core import step_rules
from bayes_keras.core.bayesian_optimizer import BayesianOptimizer, StateWrites
from bayes_keras.core.particle_view import is_particle_variable
from bayes_keras.core.rule_state import RuleState


class ParticleOptimizer(BayesianOptimizer):
    """Base class of inference methods that act on stacks of particles.

    Subclasses implement `direction(particles, grads, groups)`: lists of (N, d_v) tensors (the
    particle values and the gradients of the NEGATIVE log joint, in `self.view` order) and the
    view's layer groups -> a list of (N, d_v) directions; the step subtracted is `step_rule(direction)`.
    A method that needs more than a direction (a curvature, state of its own) overrides
    `update_particles` and ends it with `step_particles`.

    Args:
        learning_rate: step size of the particle step rule (float or schedule).
        step_rule: a `bayes_keras.step_rules.StepRule` or its name.
        shared_learning_rate: step size of the element-wise Adam on shared (deterministic)
            variables (e.g. a learned noise scale); defaults to `learning_rate` when the particle
            step rule is adaptive (its steps are in parameter units too), and to 1e-3 (Keras' Adam
            default) under "sgd", whose learning rate scales a natural-gradient or preconditioned
            direction (MatrixSVGD's 0.1-10 would move a shared log-scale by up to 10 per step).
        **kwargs: forwarded to `keras.optimizers.Optimizer` (clipnorm, clipvalue, ...).
    """

    def __init__(
        self,
        learning_rate=1e-3,
        step_rule="rmsprop",
        shared_learning_rate=None,
        name=None,
        **kwargs,
    ):
        shared_learning_rate = check_number(
            shared_learning_rate,
            f"{type(self).__name__} shared_learning_rate",
            allow_none=True,
            allow_zero=True,
        )
        super().__init__(learning_rate=learning_rate, name=name or type(self).__name__, **kwargs)
        self.step_rule = step_rules.get(step_rule)
        self.shared_rule = step_rules.Adam()
        self.shared_learning_rate = shared_learning_rate

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        rules = [
            self.step_rule if is_particle_variable(v) else self.shared_rule
            for v in self.view.all_variables
        ]
        self._slots = RuleState(self.add_variable, self.view.all_variables, rules)

    def direction(self, particles, grads, groups):
        raise NotImplementedError(
            f"{type(self).__name__} must implement direction(particles, grads, groups)."
        )

    def update(self, grads, variables, learning_rate, step):
        writes = StateWrites()
        iteration = tf.cast(self.iterations + 1, tf.float32)
        particle_grads, shared = self.view.split_gradients(grads, variables)
        if self.view.variables:
            self.update_particles(particle_grads, learning_rate, iteration, step, writes)
        shared_lr = self.shared_learning_rate
        if shared_lr is None:
            shared_lr = 1e-3 if isinstance(self.step_rule, step_rules.SGD) else learning_rate
        for g, v in shared:
            self._slots.apply(
                self.position(v), tf.cast(g, v.dtype), v, shared_lr, iteration, writes
            )
        return writes

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        """Move the particle variables: a direction over all of them jointly, then the step rule.
        `grads`: per particle variable, in view order; `iteration`: 1, 2, ... (float)."""
        directions = self.direction(
            self.view.flat_particles(), self.view.flat_gradients(grads), self.view.layer_groups
        )
        self.step_particles(directions, learning_rate, iteration, writes)

    def step_particles(self, directions, learning_rate, iteration, writes):
        """Subtract step_rule(direction) from each particle variable."""
        for d, v in zip(directions, self.view.variables):
            self._slots.apply(
                self.position(v), tf.reshape(d, v.shape), v, learning_rate, iteration, writes
            )

    def check_loaded_state(self):
        self._slots.check_loaded(self.name)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "step_rule": keras.saving.serialize_keras_object(self.step_rule),
                "shared_learning_rate": self.shared_learning_rate,
            }
        )
        return config
