"""ParticleOptimizer: the base of methods that move the particles themselves (GPF, SVGD, ensembles).

It splits the gradients into particle variables (leading axis N) and shared (deterministic)
variables, asks the method for a direction over all particle variables jointly (`direction`), turns
directions into steps with a `StepRule` whose state lives in optimizer variables, and updates shared
variables with an ordinary element-wise rule. Every new value goes through the base class's guarded
write (`BayesianOptimizer.apply`).
"""

import keras
import tensorflow as tf

from bayes_keras._config import check_number
from bayes_keras.core import step_rules
from bayes_keras.core.bayesian_optimizer import BayesianOptimizer, StateWrites
from bayes_keras.loaded_state import check_bounded_entry
from bayes_keras.core.particle_view import is_particle_variable  # noqa: F401 (re-exported)


class ParticleOptimizer(BayesianOptimizer):
    """Base class of inference methods that act on stacks of particles.

    Subclasses implement `direction(particles, grads, groups)`: lists of (N, d_v) tensors (the
    particle values and the gradients of the NEGATIVE log joint, in `self.view` order) and the
    view's layer groups -> a list of (N, d_v) directions; the step subtracted is `step_rule(direction)`.
    A method that needs more than a direction overrides `update_particles`.

    Args:
        learning_rate: step size of the particle step rule (float or schedule).
        step_rule: a `bayes_keras.core.step_rules.StepRule` or its name.
        shared_learning_rate: step size of the element-wise Adam on shared (deterministic)
            variables (e.g. a learned noise scale); defaults to `learning_rate` when the particle
            step rule is adaptive (its steps are in parameter units too), and to 1e-3 (Keras' Adam
            default) under "sgd", whose learning rate scales a natural-gradient or preconditioned
            direction (MatrixSVGD's 0.1-10 would move a shared log-scale by up to 10 per step).
        **kwargs: forwarded to `keras.optimizers.Optimizer` (clipnorm, clipvalue, ...).
    """

    def __init__(self, learning_rate=1e-3, step_rule="rmsprop", shared_learning_rate=None, name=None, **kwargs):
        shared_learning_rate = check_number(shared_learning_rate, f"{type(self).__name__} shared_learning_rate",
                                            allow_none=True, allow_zero=True)
        super().__init__(learning_rate=learning_rate, name=name or type(self).__name__, **kwargs)
        self.step_rule = step_rules.get(step_rule)
        self.shared_rule = step_rules.Adam()
        self.shared_learning_rate = shared_learning_rate

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._slots = []
        for v, rule in zip(self.view.all_variables, self._rules()):
            slots = {}
            for slot, shape in rule.slots(tuple(v.shape)).items():
                slots[slot] = self.add_variable(shape=shape, dtype=v.dtype, name=f"{_clean(v.path)}_{slot}")
            self._slots.append(slots)

    def direction(self, particles, grads, groups):
        raise NotImplementedError(f"{type(self).__name__} must implement direction(particles, grads, groups).")

    def update(self, grads, variables, learning_rate, step):
        writes = StateWrites()
        iteration = tf.cast(self.iterations + 1, tf.float32)
        particle_grads = [None] * len(self.view)
        for g, v in zip(grads, variables):
            i = self.view.index(v)
            if i is not None:
                particle_grads[i] = g
        if self.view.variables:
            # A particle variable without a gradient (it does not reach the loss) gets a zero one.
            particle_grads = [tf.zeros_like(v) if g is None else g for g, v in zip(particle_grads, self.view.variables)]
            self.update_particles(particle_grads, learning_rate, iteration, step, writes)
        shared_lr = self.shared_learning_rate
        if shared_lr is None:
            shared_lr = self._default_shared_learning_rate(learning_rate)
        for g, v in zip(grads, variables):
            if self.view.index(v) is None:
                self._apply_rule(self.shared_rule, tf.cast(g, v.dtype), v, self.position(v), shared_lr, iteration,
                                 writes)
        return writes

    def _default_shared_learning_rate(self, learning_rate):
        return 1e-3 if isinstance(self.step_rule, step_rules.SGD) else learning_rate

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        """Move the particle variables: a direction over all of them jointly, then the step rule.
        `grads`: per particle variable, in view order; `iteration`: 1, 2, ... (float)."""
        particles = self.view.flatten([v.value for v in self.view.variables])
        flat_grads = self.view.flatten([tf.cast(g, v.dtype) for g, v in zip(grads, self.view.variables)])
        directions = self.direction(particles, flat_grads, self.view.layer_groups)
        self.step_particles(directions, learning_rate, iteration, writes)

    def step_particles(self, directions, learning_rate, iteration, writes):
        """Subtract step_rule(direction) from each particle variable."""
        for d, v in zip(directions, self.view.variables):
            self._apply_rule(self.step_rule, tf.reshape(d, v.shape), v, self.position(v), learning_rate, iteration,
                             writes)

    def _apply_rule(self, rule, direction, variable, position, learning_rate, iteration, writes):
        slots = self._slots[position]
        state = {k: s.value for k, s in slots.items()}
        lr = tf.cast(learning_rate, direction.dtype)
        update, new_state = rule.apply(direction, state, lr, iteration)
        for k, value in new_state.items():
            writes.assign(slots[k], value)
        writes.assign(variable, variable.value - update)

    def check_loaded_state(self):
        """Second-moment slots (RMSProp's and Adam's v, SignalShare's squares) must be non-negative: a negative
        one made every later step non-finite, so every step was skipped."""
        for rule, slots in zip(self._rules(), self._slots):
            for name, slot in slots.items():
                if step_rules.is_second_moment(name):
                    check_bounded_entry(self.name, slot, "optimizer", f"{type(rule).__name__}'s second moment")

    def _rules(self):
        """The step rule of each of the view's variables: `step_rule` for particles, `shared_rule` for shared weights."""
        return [self.step_rule if is_particle_variable(v) else self.shared_rule for v in self.view.all_variables]

    def get_config(self):
        config = super().get_config()
        config.update({
            "step_rule": keras.saving.serialize_keras_object(self.step_rule),
            "shared_learning_rate": self.shared_learning_rate,
        })
        return config


def _clean(path):
    return path.replace("/", "_")
