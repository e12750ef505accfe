"""ParticleOptimizer: the base of methods that move the particles themselves (GPF, SVGD, MatrixSVGD,
ensembles): a direction over all particle variables jointly, then a step rule."""

import keras
import tensorflow as tf

from bayes_keras.core import step_rules
from bayes_keras.core.bayesian_optimizer import BayesianOptimizer


class ParticleOptimizer(BayesianOptimizer):
    """Base class of inference methods that act on stacks of particles.

    Subclasses implement `direction(particles, grads, blocks)`: lists of (N, d_v) tensors (the
    particle values and the gradients of the NEGATIVE log joint, in `self.view` order) and the
    view's layer blocks -> a list of (N, d_v) directions. A method that needs more than a direction (a
    curvature, state of its own) overrides `update_particles` and ends it with `step_particles`.

    Args:
        learning_rate: step size of the particle step rule (float or schedule).
        step_rule: a `bayes_keras.step_rules.StepRule` or its name.
        shared_learning_rate: step size of the element-wise Adam on shared (deterministic)
            variables; defaults to `learning_rate` when the particle step rule is adaptive (its steps
            are in parameter units too), and to 1e-3 (Keras' Adam default) under "sgd", whose learning
            rate scales a natural-gradient or preconditioned direction.
        **kwargs: forwarded to `keras.optimizers.Optimizer` (clipnorm, clipvalue, ...).
    """

    def __init__(self, learning_rate=1e-3, step_rule="rmsprop", name=None, **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        try:
            self.step_rule = step_rules.get(step_rule)
        except ValueError as error:
            raise ValueError(f"{self.method_name} step_rule: {error}") from None

    def particle_rule(self):
        return self.step_rule

    def default_shared_learning_rate(self, learning_rate):
        return 1e-3 if isinstance(self.step_rule, step_rules.SGD) else learning_rate

    def direction(self, particles, grads, blocks):
        raise NotImplementedError(
            f"{self.method_name} must implement direction(particles, grads, blocks)."
        )

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        """Move the particle variables: a direction over all of them jointly, then the step rule.
        `grads`: per particle variable, in view order; `iteration`: 1, 2, ... (float)."""
        directions = self.direction(
            self.view.flat_particles(), self.view.flat_gradients(grads), self.view.layer_blocks
        )
        self.step_particles(directions, learning_rate, iteration, writes)

    def step_particles(self, directions, learning_rate, iteration, writes):
        """Subtract step_rule(direction) from each particle variable."""
        for d, v in zip(directions, self.view.variables):
            direction = tf.reshape(d, v.shape)
            self.rule_state.apply(self.position(v), direction, v, learning_rate, iteration, writes)

    def get_config(self):
        config = super().get_config()
        config["step_rule"] = keras.saving.serialize_keras_object(self.step_rule)
        return config
