"""Ensembles: N independent particles, each by gradient descent on its own log joint (plain, or
preconditioned by a curvature)."""

from bayes_keras.optimizers.ensembles.independent_particles import IndependentParticles
from bayes_keras.optimizers.ensembles.preconditioned_particles import PreconditionedParticles

__all__ = ["IndependentParticles", "PreconditionedParticles"]
