"""BayesianOptimizer: the one contract between BayesianModel and every inference method, and the update
skeleton they share (docs/api/optimizers.md, "The contract", lists what a method overrides)."""

import dataclasses
import functools
import re
from typing import Any

import keras
import tensorflow as tf

from bayes_keras.core.optimizer_setup import OptimizerSetup
from bayes_keras.training import distribute


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What BayesianModel hands an optimizer with a step's gradients.

    Attributes:
        log_likelihood: (N,) per-particle log likelihood of the minibatch scaled to the training set,
            (dataset_size / batch) sum_b log p(y_b | x_b, w_n), divided by the temperature.
        log_prior: (N,) per-particle log prior divided by the temperature.
        temperature: the posterior temperature T (a Python float).
        dataset_size: the number of training examples (a Python float).
        curvature: the `bayes_keras.curvature.LayerRecord`s the optimizer's `curvature_request` asked for.
        prepared: what the optimizer's `prepare_step()` returned for this step (None if nothing).
    """

    log_likelihood: Any
    log_prior: Any
    temperature: float = 1.0
    dataset_size: float = 1.0
    curvature: tuple = ()
    prepared: Any = None

    @property
    def log_joint(self):
        """(N,) tempered log joint, the quantity whose negative gradient the optimizer is handed."""
        return self.log_likelihood + self.log_prior

    @functools.cached_property
    def finite(self):
        """Whether the log joint and the curvature records are finite (computed once per step)."""
        finite = tf.reduce_all(tf.math.is_finite(self.log_joint))
        for r in self.curvature:
            for g in (r.output_gradients, r.sampled_output_gradients):
                if g is not None:
                    finite = finite & tf.reduce_all(tf.math.is_finite(g))
        return finite


class StateWrites:
    """The new values an update computes, written together only when all of them are finite.

    An update calls `assign(variable, value)` instead of `variable.assign(value)`, `read(variable)` for a
    value it may already have replaced in this step, and `require(condition)` for a condition of its own.
    """

    def __init__(self):
        self._values = {}
        self._variables = {}
        self._conditions = []

    def assign(self, variable, value):
        self._variables[id(variable)] = variable
        self._values[id(variable)] = tf.cast(value, variable.dtype)

    def read(self, variable):
        return self._values.get(id(variable), variable.value)

    def require(self, condition):
        self._conditions.append(tf.convert_to_tensor(condition, tf.bool))

    def finite(self):
        """Every required condition holds and every new value has a finite sum of squares: no NaN or inf,
        and no element beyond sqrt(max float) (1.8e19 in float32), where a weight's own prior density
        overflows; an exploding update is refused like a NaN one."""
        ok = tf.constant(True)
        for c in self._conditions:
            ok = ok & c
        squares = {}  # one reduction per value (tf.nn.l2_loss, which XLA compiles), one max per dtype
        for value in self._values.values():
            if value.dtype.is_floating:
                squares.setdefault(value.dtype, []).append(tf.nn.l2_loss(value))
        for group in squares.values():
            ok = ok & tf.math.is_finite(tf.reduce_max(tf.stack(group)))
        return ok

    def commit(self):
        """Write the new values (under tf.distribute, in a replica: its copy of each variable)."""
        for variable, value in zip(self._variables.values(), self._values.values()):
            variable.assign(value)

    def __len__(self):
        return len(self._values)


class BayesianOptimizer(OptimizerSetup):
    """Base class of bayes_keras' inference methods: the update skeleton every method shares.

    `apply(grads, variables, step)` clips, calls `update`, and writes its `StateWrites` only if all are
    finite (else counts the step in `skipped_updates` and changes nothing). The default `update` splits the
    gradients into particle and shared variables, asks the method's `update_particles(grads,
    learning_rate, iteration, step, writes)` for the particles' new values, and steps the shared variables
    by an element-wise Adam at `shared_learning_rate`. What else a method may override is listed in the
    API reference ("The contract").

    Args:
        learning_rate: float or `keras.optimizers.schedules.LearningRateSchedule`.
        shared_learning_rate: the shared (deterministic) variables' Adam step size (None: the method's
            `default_shared_learning_rate`, 1e-3 unless the method says otherwise).
        **kwargs: forwarded to `keras.optimizers.Optimizer` (clipnorm, clipvalue, global_clipnorm).

    Example (a deep ensemble, each particle by gradient descent on its own -log joint; `grads` are the
    gradients of the negative log joint divided by the temperature, `v` a particle variable):

        >>> import tensorflow as tf
        >>> class Ensemble(bayes_keras.optimizers.BayesianOptimizer):
        ...     def update_particles(self, grads, learning_rate, iteration, step, writes):
        ...         for g, v in zip(grads, self.view.variables):
        ...             writes.assign(v, v.value - tf.cast(learning_rate, v.dtype) * g)
        >>> model.compile(optimizer=Ensemble(learning_rate=1e-3))
    """

    # -- the hooks the step calls (the others: OptimizerSetup) ------------------------------
    def update_particles(self, grads, learning_rate, iteration, step, writes):
        raise NotImplementedError(
            f"{self.method_name} must implement update_particles(grads, learning_rate, iteration, "
            "step, writes) or update(grads, variables, learning_rate, step)."
        )

    def default_shared_learning_rate(self, learning_rate):
        return 1e-3

    def prepare_step(self):
        return None

    def report(self, step):
        return {}

    # -- the update skeleton -------------------------------------------------------------------
    def update(self, grads, variables, learning_rate, step):
        """The new values of the particle variables, the shared variables and the method's state."""
        writes = StateWrites()
        iteration = tf.cast(self.iterations + 1, tf.float32)
        particle_grads, shared = self.view.split_gradients(grads, variables)
        if self.view.variables:
            returned = self.update_particles(particle_grads, learning_rate, iteration, step, writes)
            if returned is not None or not len(writes):
                raise TypeError(
                    f"{self.method_name}.update_particles must assign the new values into `writes` "
                    "(writes.assign(variable, value)) and return None; it "
                    + ("returned a value." if returned is not None else "assigned nothing.")
                )
        shared_lr = self.shared_learning_rate
        if shared_lr is None:
            shared_lr = self.default_shared_learning_rate(learning_rate)
        for g, v in shared:
            position = self.position(v)
            self.rule_state.apply(position, tf.cast(g, v.dtype), v, shared_lr, iteration, writes)
        return writes

    def apply(self, grads, trainable_variables=None, step=None):
        """Update the variables from the gradients of the negative log joint; returns a boolean tensor:
        whether the update was written."""
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    f"{self.method_name}.apply without variables needs a built optimizer: call "
                    "optimizer.build(model.trainable_variables) first."
                )
            trainable_variables = self.view.all_variables
        trainable_variables = list(trainable_variables)
        if not self.built:  # built inside a traced step (a custom loop's first apply): eagerly
            with tf.init_scope(), keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
        if tf.distribute.has_strategy():
            distribute.check_strategy()
        pairs = [(g, v) for g, v in zip(grads, trainable_variables) if g is not None]
        for _, v in pairs:
            self.position(v)
        grads = self._clip([g for g, _ in pairs])
        # (a name scope at the root of a traced step must start with a letter, digit or '.')
        scope = re.sub(r"^[^A-Za-z0-9.]+", "", self.name) or "optimizer"
        with keras.name_scope(scope, caller=self):
            writes = self.update(grads, [v for _, v in pairs], self.learning_rate, step)
            if step is not None:  # a non-finite loss or curvature record (the model counts it too)
                writes.require(step.finite)
            finite = writes.finite()
            if tf.distribute.has_strategy():  # one decision for all replicas (docs/distributed.md)
                finite = distribute.all_replicas_agree(finite)

            def commit():
                writes.commit()
                return tf.constant(True)

            tf.cond(finite, commit, lambda: tf.constant(False))
            # Counted outside the decision: `iterations` (Keras' "only first replica" variable) would need
            # a merge_call in it. The learning-rate schedule reads committed + skipped updates.
            written = tf.cast(finite, self.iterations.dtype)
            self.iterations.assign_add(written)
            self.skipped_updates.assign_add(tf.cast(1 - written, self.skipped_updates.dtype))
            return finite

    def apply_gradients(self, grads_and_vars, step=None):
        grads, variables = zip(*grads_and_vars)
        return self.apply(list(grads), list(variables), step)

    def position(self, variable):
        """Index of `variable` among those the optimizer was built with (KeyError if unknown)."""
        position = self.view.position(variable)
        if position is None:
            raise KeyError(
                f"{self.method_name} was not built with variable {variable.path}; it was built "
                f"with {len(self.view.all_variables)} variables."
            )
        return position

    @property
    def attempted_steps(self):
        """Updates attempted so far, committed (`iterations`) or skipped: the step a learning-rate
        schedule is asked for, so that one non-finite step costs one step of the schedule."""
        if not self.built:
            return self.iterations
        return self.iterations + tf.cast(self.skipped_updates, self.iterations.dtype)

    def _get_current_learning_rate(self):
        if isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.attempted_steps)
        return super()._get_current_learning_rate()

    def _clip(self, grads):
        if self.clipvalue is not None:
            grads = [tf.clip_by_value(g, -self.clipvalue, self.clipvalue) for g in grads]
        if self.clipnorm is not None:
            grads = [tf.clip_by_norm(g, self.clipnorm) for g in grads]
        if self.global_clipnorm is not None:
            grads, _ = tf.clip_by_global_norm(grads, self.global_clipnorm)
        return list(grads)
