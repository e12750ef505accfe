"""Inference methods as Keras optimizers, one package or file per method (its Keras class and its math).

- gaussian_particle_flow.py: GaussianParticleFlow (GPF)
- svgd/: SVGD, MatrixSVGD
- gaussian_vi/: MGVBP, MeanFieldVI (and the Gaussian families they step)
- ensembles/: IndependentParticles, PreconditionedParticles

The contract they implement (BayesianOptimizer, StepInfo, StateWrites, ParticleView) is bayes_keras.core,
re-exported here for writing a method of one's own.
"""

from bayes_keras.core import (
    BayesianOptimizer,
    ParticleOptimizer,
    ParticleView,
    StateWrites,
    StepInfo,
)
from bayes_keras.optimizers.ensembles import IndependentParticles, PreconditionedParticles
from bayes_keras.optimizers.gaussian_particle_flow import GaussianParticleFlow
from bayes_keras.optimizers.gaussian_vi import MGVBP, GaussianVariationalOptimizer, MeanFieldVI
from bayes_keras.optimizers.svgd import SVGD, MatrixSVGD

GPF = GaussianParticleFlow

__all__ = [
    "BayesianOptimizer",
    "StepInfo",
    "StateWrites",
    "ParticleView",
    "ParticleOptimizer",
    "GaussianParticleFlow",
    "GPF",
    "IndependentParticles",
    "GaussianVariationalOptimizer",
    "MGVBP",
    "MeanFieldVI",
    "SVGD",
    "MatrixSVGD",
    "PreconditionedParticles",
]
