"""ParticleOptimizer: the thin Keras wrapper shared by every particle method.

It sees the gradients of all variables at once, splits them into particle variables (leading axis N)
and shared (deterministic) variables, asks the method for a direction over all particle variables
jointly (`direction`), turns directions into steps with a `StepRule` whose state lives in optimizer
variables, and updates shared variables with an ordinary element-wise rule.
"""

import keras
import tensorflow as tf

from bayes_keras._config import check_number
from bayes_keras.inference import step_rules


def is_particle_variable(variable):
    return bool(getattr(variable, "is_particle_variable", False))


class ParticleOptimizer(keras.optimizers.Optimizer):
    """Base class of inference methods that act on stacks of particles.

    Subclasses implement `direction(particles, grads)`: lists of (N, d_v) tensors -> list of
    directions (the step subtracted is `step_rule(direction)`).

    Args:
        learning_rate: step size of the particle step rule (float or schedule).
        step_rule: a `bayes_keras.inference.step_rules.StepRule` or its name.
        shared_learning_rate: step size of the element-wise Adam on shared (deterministic)
            variables (e.g. a learned noise scale); defaults to `learning_rate` when the particle
            step rule is adaptive (its steps are in parameter units too), and to 1e-3 (Keras' Adam
            default) under "sgd", whose learning rate scales a natural-gradient or preconditioned
            direction (MatrixSVGD's 0.1-10 would move a shared log-scale by up to 10 per step).
        **kwargs: forwarded to `keras.optimizers.Optimizer` (clipnorm, clipvalue, ...).
    """

    def __init__(self, learning_rate=1e-3, step_rule="rmsprop", shared_learning_rate=None, name=None, **kwargs):
        if not isinstance(learning_rate, (keras.optimizers.schedules.LearningRateSchedule, dict)) \
                and not callable(learning_rate):
            # 0 is allowed (a frozen run, e.g. to read curvature statistics without moving)
            learning_rate = check_number(learning_rate, f"{type(self).__name__} learning_rate", allow_zero=True)
        shared_learning_rate = check_number(shared_learning_rate, f"{type(self).__name__} shared_learning_rate",
                                            allow_none=True, allow_zero=True)
        super().__init__(learning_rate=learning_rate, name=name or type(self).__name__, **kwargs)
        self.step_rule = step_rules.get(step_rule)
        self.shared_rule = step_rules.Adam()
        self.shared_learning_rate = shared_learning_rate
        self._layer_groups = None  # list of lists of particle variables, set by BayesianModel.compile

    # -- contract with the model ---------------------------------------------------------------
    def bind_layer_groups(self, layer_groups):
        """Record which particle variables belong to one layer (for per-layer structures)."""
        self._layer_groups = [list(g) for g in layer_groups if g]

    def _groups_for(self, particle_vars):
        """Index groups of `particle_vars`, one per layer (or one per variable if unbound)."""
        index = {self._var_key(v): i for i, v in enumerate(particle_vars)}
        if self._layer_groups is None:
            return [[i] for i in range(len(particle_vars))]
        groups = []
        for layer_vars in self._layer_groups:
            g = [index[self._var_key(v)] for v in layer_vars if self._var_key(v) in index]
            if g:
                groups.append(g)
        covered = {i for g in groups for i in g}
        groups.extend([i] for i in range(len(particle_vars)) if i not in covered)
        return groups

    # -- Keras optimizer API -------------------------------------------------------------------
    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._slots = []
        for v in variables:
            rule = self.step_rule if is_particle_variable(v) else self.shared_rule
            slots = {}
            for slot, shape in rule.slots(tuple(v.shape)).items():
                slots[slot] = self.add_variable(shape=shape, dtype=v.dtype, name=f"{_clean(v.path)}_{slot}")
            self._slots.append(slots)

    def direction(self, particles, grads):
        raise NotImplementedError

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1:
            raise NotImplementedError(
                f"{type(self).__name__} couples particles across variables and does not yet support "
                "tf.distribute with several replicas."
            )
        step = tf.cast(self.iterations + 1, tf.float32)
        pairs = [(g, v, self._slots[self._get_variable_index(v)]) for g, v in zip(grads, trainable_variables)]
        particle = [(g, v, s) for g, v, s in pairs if is_particle_variable(v)]
        shared = [(g, v, s) for g, v, s in pairs if not is_particle_variable(v)]
        if particle:
            self._update_particles([v for _, v, _ in particle], [g for g, _, _ in particle],
                                   [s for _, _, s in particle], learning_rate, step)
        shared_lr = self.shared_learning_rate
        if shared_lr is None:
            shared_lr = self._default_shared_learning_rate(learning_rate)
        for g, v, slots in shared:
            self._apply_rule(self.shared_rule, tf.cast(g, v.dtype), v, slots, shared_lr, step)

    def _default_shared_learning_rate(self, learning_rate):
        return 1e-3 if isinstance(self.step_rule, step_rules.SGD) else learning_rate

    def _update_particles(self, pvars, grads, slots, learning_rate, step):
        """Move the particle variables: direction over all of them jointly, then the step rule."""
        directions = self.direction(*self._flat_particles(pvars, grads), self._groups_for(pvars))
        self._step_particles(directions, pvars, slots, learning_rate, step)

    @staticmethod
    def _flat_particles(pvars, grads):
        """The particle variables' values and gradients as (N, d_v) tensors."""
        n = pvars[0].shape[0]
        return ([tf.reshape(v.value, (n, -1)) for v in pvars],
                [tf.reshape(tf.cast(g, v.dtype), (n, -1)) for g, v in zip(grads, pvars)])

    def _step_particles(self, directions, pvars, slots, learning_rate, step):
        """Subtract step_rule(direction) from each particle variable."""
        for d, v, s in zip(directions, pvars, slots):
            self._apply_rule(self.step_rule, tf.reshape(d, v.shape), v, s, learning_rate, step)

    def _apply_rule(self, rule, direction, variable, slots, learning_rate, step):
        state = {k: s.value for k, s in slots.items()}
        lr = tf.cast(learning_rate, direction.dtype)
        update, new_state = rule.apply(direction, state, lr, step)
        for k, value in new_state.items():
            slots[k].assign(value)
        variable.assign_sub(update)

    def get_config(self):
        config = super().get_config()
        config.update({
            "step_rule": keras.saving.serialize_keras_object(self.step_rule),
            "shared_learning_rate": self.shared_learning_rate,
        })
        return config


def _clean(path):
    return path.replace("/", "_")
