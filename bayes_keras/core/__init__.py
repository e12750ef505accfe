"""The contract every inference method implements, and the pieces methods compose.

- `BayesianOptimizer`, `StepInfo`, `StateWrites`: the one model-optimizer contract (gradients and a
  StepInfo in, new values out, written only when all are finite).
- `ParticleView`: the particle variables an optimizer was built with, their layers, priors and partitions.
- `step_rules`: optax-style pure transforms (direction -> step, with their state as named slots).
- `ParticleOptimizer`: the thin base of methods that move the particles themselves (a direction over
  all particle variables, then a step rule).

Nothing here imports a method; the methods (bayes_keras.optimizers) import this.
"""

from bayes_keras.core import step_rules
from bayes_keras.core.bayesian_optimizer import BayesianOptimizer, StateWrites, StepInfo
from bayes_keras.core.particle_optimizer import ParticleOptimizer
from bayes_keras.core.particle_view import ParticleView

__all__ = [
    "BayesianOptimizer",
    "StepInfo",
    "StateWrites",
    "ParticleView",
    "ParticleOptimizer",
    "step_rules",
]
