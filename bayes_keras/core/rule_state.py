"""RuleState: the state of the step rules an optimizer applies, kept in its optimizer variables.

A step rule (bayes_keras.core.step_rules) is a pure transform: `slots(shape)` names its state and
`apply(direction, state, learning_rate, step)` returns (step, new_state). RuleState creates those slots
as optimizer variables (so they are saved with the model) for every variable the optimizer was built
with, in order, and applies a variable's rule through the step's `StateWrites`. Both kinds of method
compose it: the particle movers (ParticleOptimizer: the particle step rule and the shared weights'
Adam) and the Gaussian-VI methods (the shared weights' Adam only).
"""

import tensorflow as tf


class RuleState:
    """Slots of `rules[i]` for `variables[i]`, created with `add_variable(shape, dtype, name)`.

    Attributes:
        rules: the rule of each variable.
        slots: per variable, {slot name: optimizer variable}.
    """

    def __init__(self, add_variable, variables, rules):
        self.rules = list(rules)
        self.slots = []
        for v, rule in zip(variables, self.rules):
            self.slots.append(
                {
                    slot: add_variable(shape=shape, dtype=v.dtype, name=f"{_clean(v.path)}_{slot}")
                    for slot, shape in rule.slots(tuple(v.shape)).items()
                }
            )

    def apply(self, position, direction, variable, learning_rate, iteration, writes):
        """Subtract rules[position](direction) from `variable`; the rule's new state and the new value go
        into `writes`. `iteration`: the step count 1, 2, ... (float)."""
        slots = self.slots[position]
        state = {k: s.value for k, s in slots.items()}
        update, new_state = self.rules[position].apply(
            direction, state, tf.cast(learning_rate, direction.dtype), iteration
        )
        for k, value in new_state.items():
            writes.assign(slots[k], value)
        writes.assign(variable, variable.value - update)

    def __iter__(self):
        return iter(self.slots)


def _clean(path):
    return path.replace("/", "_")
