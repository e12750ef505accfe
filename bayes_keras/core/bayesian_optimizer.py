"""BayesianOptimizer: the one contract between BayesianModel and every inference method.

A method is a Keras optimizer that overrides a few documented methods (below). Everything the model
knows about a training step reaches it as arguments: the gradients, and a `StepInfo` with the
step's per-particle log likelihood and log prior, the temperature, the training-set size, the
captured curvature records and the noise drawn for the step. Nothing per-step is kept on the
optimizer between calls. The update is computed as a set of new values (`StateWrites`) and written
only when every one of them is finite; otherwise nothing changes, and the skip is counted in
`skipped_updates` (BayesianModel.fit warns).
"""

import dataclasses
import functools
import math
import re
import warnings
from typing import Any

import keras
import tensorflow as tf

from bayes_keras.training import distribute
from bayes_keras._config import check_number
from bayes_keras.core.particle_view import ParticleView
from bayes_keras.saving.loaded_state import (
    check_bounded_entry,
    check_finite_entries,
    remembered_refusal,
)
from bayes_keras.training.memory_guard import check_training_step_fits

_UNSUPPORTED = ("weight_decay", "use_ema", "gradient_accumulation_steps", "loss_scale_factor")


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What BayesianModel hands an optimizer with a step's gradients (`BayesianModel.bayesian_gradients`).

    Attributes:
        log_likelihood: (N,) per-particle log likelihood of the minibatch scaled to the training set,
            (dataset_size / batch) sum_b log p(y_b | x_b, w_n), divided by the temperature.
        log_prior: (N,) per-particle log prior divided by the temperature.
        temperature: the posterior temperature T (a Python float).
        dataset_size: the number of training examples (a Python float).
        curvature: the step's `bayes_keras.curvature.LayerRecord`s when the optimizer's
            `curvature_request` asked for them, else ().
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
        """Whether the log joint and the curvature records (per-example output gradients) are finite:
        computed once per step, for the optimizer's guard and the model's count of skipped steps."""
        finite = tf.reduce_all(tf.math.is_finite(self.log_joint))
        for r in self.curvature:
            for g in (r.output_gradients, r.sampled_output_gradients):
                if g is not None:
                    finite = finite & tf.reduce_all(tf.math.is_finite(g))
        return finite


class StateWrites:
    """The new values an update computes, written together only when all of them are finite.

    An update calls `assign(variable, value)` instead of `variable.assign(value)`, and `read(variable)`
    for a value it may already have replaced in this step (e.g. sampling the updated posterior).
    `require(condition)` adds a condition of its own (e.g. a finite curvature).
    """

    def __init__(self):
        self._values = {}
        self._variables = {}
        self._conditions = []

    def assign(self, variable, value):
        key = id(variable)
        self._variables[key] = variable
        self._values[key] = tf.cast(value, variable.dtype)

    def read(self, variable):
        return self._values.get(id(variable), variable.value)

    def require(self, condition):
        self._conditions.append(tf.convert_to_tensor(condition, tf.bool))

    def finite(self):
        """Whether every new value has a finite sum of squares (no NaN, no inf, no element beyond
        sqrt(max float): 1.8e19 in float32) and every required condition holds. For a particle the bound is the point: a weight
        beyond it overflows its own prior density (-w^2 / 2 s^2), so the next step could not evaluate it,
        and a finite but exploding update (e.g. from one 1e30 gradient) is refused like a NaN one."""
        ok = tf.constant(True)
        for c in self._conditions:
            ok = ok & c
        # One reduction per value, its sum of squares (tf.nn.l2_loss: NaN / inf if any square is; XLA
        # compiles it, unlike EuclideanNorm), then the largest per dtype: the check costs about as many
        # ops as values written (a few ops per value slowed a small MLP's step measurably).
        squares = {}
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


class BayesianOptimizer(keras.optimizers.Optimizer):
    """Base class of bayes_keras' inference methods.

    A method overrides:

    - `update(grads, variables, learning_rate, step) -> StateWrites` (required): the new values of
      the particle variables, shared variables and the method's own state. `grads` are gradients of
      the NEGATIVE tempered log joint (particle variables: per particle; shared variables: the
      particle mean), `step` a `StepInfo` (None when a custom loop calls `apply(grads, variables)`
      without one; a method that needs it raises).
    - `check_num_particles(n)`: raise ValueError when the method cannot run with n particles.
    - `curvature_request`: None, or a `bayes_keras.curvature.CurvatureRequest` (Kronecker factors or
      squared gradients, observed or sampled labels): what BayesianModel must capture in the forward
      pass; the step's `LayerRecord`s then arrive as `step.curvature`.
    - `prepare_step()`: tensors computed before the forward pass, off its critical path (the normals of
      q's next sample; the particles' centred values and Grams, which both GPF's free energy and its
      direction use), handed back as `step.prepared`. They may read the variables: nothing writes them
      between `prepare_step` and `update`.
    - `report(step) -> dict`: metric values of the step before the update (e.g. "free_energy",
      "elbo", per training example), named in `reported_metrics`.
    - `bind_log_prob(fn)`: the functional door's log density, for methods whose curvature needs it.

    `build` creates `self.view`, a `ParticleView` of the particle variables it is given (their
    layers, priors and partitions), whoever calls it: `BayesianModel.fit`, a custom loop's first
    `apply`, or `run_particles`. `apply(grads, variables, step)` clips (clipnorm / clipvalue /
    global_clipnorm), calls `update`, and writes its values only if they are all finite; a step that
    is not is counted in `skipped_updates` and leaves everything unchanged (iterations included: it counts
    committed updates; a learning-rate schedule is read at iterations + skipped_updates, every attempted
    step, so a skip costs one step of the schedule).

    Example (a deep ensemble, each particle by gradient descent on its own -log joint):

        >>> class Ensemble(bayes_keras.optimizers.BayesianOptimizer):
        ...     def update(self, grads, variables, learning_rate, step):
        ...         writes = bayes_keras.optimizers.StateWrites()
        ...         for g, v in zip(grads, variables):
        ...             writes.assign(v, v.value - tf.cast(learning_rate, v.dtype) * g)
        ...         return writes
        >>> model.compile(optimizer=Ensemble(learning_rate=1e-3))
    """

    reported_metrics = ()
    curvature_request = None

    def __init__(self, learning_rate=1e-3, name=None, **kwargs):
        for key in _UNSUPPORTED:
            if kwargs.get(key):
                raise ValueError(
                    f"{type(self).__name__} does not support {key}={kwargs[key]!r}: a Bayesian "
                    "optimizer's update is its inference method (the prior plays the role of weight "
                    "decay; the particles or q already average over weights)."
                )
            kwargs.pop(key, None)
        if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            _check_schedule(learning_rate, f"{type(self).__name__} learning_rate")
        elif not isinstance(learning_rate, dict) and not callable(learning_rate):
            # 0 is allowed (a frozen run, e.g. to read curvature statistics without moving)
            learning_rate = check_number(
                learning_rate, f"{type(self).__name__} learning_rate", allow_zero=True
            )
        super().__init__(learning_rate=learning_rate, name=name or type(self).__name__, **kwargs)
        self.view = None

    # -- what a method overrides ---------------------------------------------------------------
    def check_num_particles(self, num_particles):
        if num_particles < 1:
            raise ValueError(
                f"{type(self).__name__} needs at least one particle; got {num_particles}."
            )

    def warn_if_one_particle(self, num_particles, what):
        """A method whose uncertainty comes from the spread of N >= 2 particles warns (once) at N = 1, saying
        what it does then (`what`)."""
        if num_particles == 1 and not getattr(self, "_warned_one_particle", False):
            self._warned_one_particle = True
            warnings.warn(
                f"{type(self).__name__} with num_particles=1 {what}: the model will report zero epistemic "
                "uncertainty. Use num_particles >= 2 (10 or more for a usable posterior).",
                UserWarning,
                stacklevel=3,
            )

    def prepare_step(self):
        return None

    def check_particles(self):
        """Called by `BayesianModel.fit` as training starts (eagerly, on the weights the fit starts from) to warn
        about a start the method cannot move from (e.g. GPF's identical particles); default: nothing."""

    def report(self, step):
        return {}

    def bind_log_prob(self, log_prob_fn):
        """The functional door (`run_particles`) hands its log density here; default: not needed."""

    def update(self, grads, variables, learning_rate, step):
        raise NotImplementedError(
            f"{type(self).__name__} must implement update(grads, variables, learning_rate, "
            "step) -> StateWrites."
        )

    # -- the Keras optimizer API ---------------------------------------------------------------
    def build(self, variables):
        if self.built:
            return
        variables = list(variables)
        super().build(variables)
        self.view = ParticleView(variables)
        if self.view.num_particles is not None:
            self.check_num_particles(self.view.num_particles)
            self.check_step_fits()
        self.skipped_updates = self.add_variable((), dtype="int64", name="skipped_updates")

    # Peak memory of a training step per byte of particle weights: the weights, the optimizer's state, the gradients
    # and the update's temporaries, on a layer whose activations are small (benchmarks/size_guard_peaks.py measures
    # it per method). Activations come on top, with the batch.
    step_headroom = 10
    # N x N float tensors a step of this method holds at once (kernel matrices): 0 for methods without them
    pairwise_tensors = 0

    def check_step_fits(self):
        """Refuse, with the estimate, a method and particle count whose training step cannot fit this machine's
        memory, before its state is built (a step otherwise fails in TensorFlow's allocator, or in numpy)."""
        check_training_step_fits(
            type(self).__name__, self.view.variables, self.step_headroom, self.pairwise_tensors
        )

    def position(self, variable):
        """Index of `variable` among those the optimizer was built with (KeyError if unknown)."""
        position = self.view.position(variable)
        if position is None:
            raise KeyError(
                f"{type(self).__name__} was not built with variable {variable.path}; it was built "
                f"with {len(self.view.all_variables)} variables."
            )
        return position

    def apply(self, grads, trainable_variables=None, step=None):
        """Update the variables from the gradients of the negative log joint; see the class docstring.
        Returns a boolean tensor: whether the update was written."""
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    f"{type(self).__name__}.apply without variables needs a built optimizer: call "
                    "optimizer.build(model.trainable_variables) first."
                )
            trainable_variables = self.view.all_variables
        trainable_variables = list(trainable_variables)
        if not self.built:
            # Built inside a traced step (a custom loop's first apply): create and initialise eagerly.
            with tf.init_scope(), keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
        if tf.distribute.has_strategy():
            distribute.check_strategy()
        pairs = [(g, v) for g, v in zip(grads, trainable_variables) if g is not None]
        for _, v in pairs:
            self.position(v)
        grads = self._clip([g for g, _ in pairs])
        variables = [v for _, v in pairs]
        # (A name scope at the root of a traced step must start with a letter, digit or '.')
        with keras.name_scope(
            re.sub(r"^[^A-Za-z0-9.]+", "", self.name) or "optimizer", caller=self
        ):
            writes = self.update(grads, variables, self.learning_rate, step)
            if (
                step is not None
            ):  # a non-finite loss or curvature record (the model counts it in skipped_steps)
                writes.require(step.finite)
            finite = writes.finite()
            if tf.distribute.has_strategy():
                # Every replica computed the same values from the reduced gradients; the decision is taken for
                # all at once, and each replica writes its copy (docs/distributed.md).
                finite = distribute.all_replicas_agree(finite)

            def commit():
                writes.commit()
                return tf.constant(True)

            tf.cond(finite, commit, lambda: tf.constant(False))
            # Counted outside the decision: `iterations` (Keras' "only first replica" variable) would
            # need a merge_call in it. The learning-rate schedule reads committed + skipped updates.
            written = tf.cast(finite, self.iterations.dtype)
            self.iterations.assign_add(written)
            self.skipped_updates.assign_add(tf.cast(1 - written, self.skipped_updates.dtype))
            return finite

    def load_own_variables(self, store):
        """Keras' loading, then checks of the loaded state: every variable finite, the step counters
        bounded, and what a subclass declares in `check_loaded_state` (e.g. MGVBP's precisions positive)."""
        with remembered_refusal(self, store):
            super().load_own_variables(store)
            if len(store.keys()) == len(self.variables):  # Keras skips a state of another size
                check_finite_entries(self.name, self.variables, "optimizer")
                for counter in (self.iterations, self.skipped_updates):
                    check_bounded_entry(self.name, counter, "optimizer", "a step count")
                self.check_loaded_state()

    def check_loaded_state(self):
        """Raise a ValueError naming the entry if loaded state is out of range (default: nothing more)."""

    def apply_gradients(self, grads_and_vars, step=None):
        grads, variables = zip(*grads_and_vars)
        return self.apply(list(grads), list(variables), step)

    @property
    def attempted_steps(self):
        """Updates attempted so far, committed (`iterations`) or skipped: the step a learning-rate schedule
        is asked for, so that one non-finite rate costs one step, not all later ones."""
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


def _check_schedule(schedule, what):
    """A learning-rate schedule must start at a finite, non-negative rate (a float is checked by the
    constructors; a negative schedule would ascend the loss without any error, its updates finite)."""
    with tf.init_scope():
        first = float(tf.convert_to_tensor(schedule(0)))
    if not math.isfinite(first) or first < 0:
        raise ValueError(
            f"{what}: the schedule must give a finite non-negative rate; {type(schedule).__name__} "
            f"gives {first!r} at step 0."
        )
