"""OptimizerSetup: everything of a BayesianOptimizer but its step.

Arguments and their checks, `build` (the `ParticleView` of the variables and the step rules' state),
the checks of a method's particle count, of its memory and of a loaded state, and the configuration.
`BayesianOptimizer` (bayesian_optimizer.py) adds the step: what runs every training step.
"""

import inspect
import warnings

import keras

from bayes_keras._config import check_number, check_optimizer_arguments
from bayes_keras.core import step_rules
from bayes_keras.core.particle_view import ParticleView, is_particle_variable
from bayes_keras.core.rule_state import RuleState
from bayes_keras.saving.loaded_state import check_bounded_entry, load_checked_optimizer_state
from bayes_keras.training.memory_guard import check_training_step_fits


class OptimizerSetup(keras.optimizers.Optimizer):
    """The construction, build, checks and configuration of a `BayesianOptimizer` (its base class; see
    there and the API reference's "The contract" for what a method overrides)."""

    reported_metrics = ()
    curvature_request = None
    # peak step memory per byte of particle weights (benchmarks/size_guard_peaks.py)
    step_headroom = 10
    pairwise_tensors = 0  # N x N tensors a step holds at once (kernel matrices)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        hook = cls.__dict__.get("update_particles")
        if hook is not None:  # a wrong signature is told at the class, not deep in the first fit
            try:
                inspect.signature(hook).bind(
                    None, "grads", "learning_rate", "iteration", "step", "writes"
                )
            except TypeError:
                raise TypeError(
                    f"{cls.__name__}.update_particles must take (self, grads, learning_rate, iteration, "
                    f"step, writes); it takes {inspect.signature(hook)}."
                ) from None

    def __init__(self, learning_rate=1e-3, shared_learning_rate=None, name=None, **kwargs):
        what = self.method_name
        learning_rate = check_optimizer_arguments(what, learning_rate, kwargs)
        shared_learning_rate = check_number(
            shared_learning_rate, f"{what} shared_learning_rate", allow_none=True, allow_zero=True
        )
        super().__init__(learning_rate=learning_rate, name=name or what, **kwargs)
        self.shared_learning_rate = shared_learning_rate
        self.shared_rule = step_rules.ElementwiseAdam()
        self.view = None

    @property
    def method_name(self):
        """The class users construct, as messages name it (MGVBP's structure classes say "MGVBP")."""
        return type(self).__name__

    def particle_rule(self):
        """The step rule whose slots the particle variables get (default: SGD, which has none)."""
        return step_rules.SGD()

    def check_num_particles(self, num_particles):
        if num_particles < 1:
            raise ValueError(
                f"{self.method_name} needs at least one particle; got {num_particles}."
            )

    def check_particles(self):
        """Warn, as fit starts, about a start the method cannot move from (default: nothing)."""

    def check_loaded_state(self):
        """Raise a ValueError naming the entry when loaded state is out of range. Here: the step rules'
        second moments (RMSProp's and Adam's v, SignalShare's squares) must be non-negative; a negative one
        made every later step non-finite, so every step was skipped."""
        for rule, slots in zip(self.rule_state.rules, self.rule_state.slots):
            for slot_name, slot in slots.items():
                if step_rules.is_second_moment(slot_name):
                    check_bounded_entry(
                        self.name, slot, "optimizer", f"{type(rule).__name__}'s second moment"
                    )

    def bind_log_prob(self, log_prob_fn):
        """The functional door (`run_particles`) hands its log density here; default: not needed."""

    def warn_if_one_particle(self, num_particles, what):
        """Warn once, at N = 1, that a method whose uncertainty is its particles' spread does `what`."""
        if num_particles == 1 and not getattr(self, "_warned_one_particle", False):
            self._warned_one_particle = True
            warnings.warn(
                f"{self.method_name} with num_particles=1 {what}: the model will report zero "
                "epistemic uncertainty. Use num_particles >= 2 (10 or more for a usable posterior).",
                UserWarning,
                stacklevel=3,
            )

    def check_step_fits(self):
        """Refuse a particle count whose training step cannot fit this machine's memory."""
        check_training_step_fits(
            self.method_name, self.view.variables, self.step_headroom, self.pairwise_tensors
        )

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
        rules = [
            self.particle_rule() if is_particle_variable(v) else self.shared_rule
            for v in self.view.all_variables
        ]
        self.rule_state = RuleState(self.add_variable, self.view.all_variables, rules)

    def load_own_variables(self, store):
        """Keras' loading, then checks: every variable finite, the step counters bounded, and
        `check_loaded_state` (e.g. MGVBP's precisions positive)."""
        load_checked_optimizer_state(self, store, super().load_own_variables)

    def get_config(self):
        config = super().get_config()
        config["shared_learning_rate"] = self.shared_learning_rate
        return config
