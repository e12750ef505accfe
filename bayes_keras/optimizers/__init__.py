"""Inference methods as Keras optimizers (one file per method)."""

from bayes_keras.optimizers.bayesian_optimizer import BayesianOptimizer, StateWrites, StepInfo
from bayes_keras.optimizers.gaussian_particle_flow import GaussianParticleFlow
from bayes_keras.optimizers.gaussian_variational_optimizer import GaussianVariationalOptimizer
from bayes_keras.optimizers.independent_particles import IndependentParticles
from bayes_keras.optimizers.mean_field_vi import MeanFieldVI
from bayes_keras.optimizers.mgvbp import MGVBP
from bayes_keras.optimizers.particle_optimizer import ParticleOptimizer
from bayes_keras.optimizers.particle_view import ParticleView

GPF = GaussianParticleFlow

__all__ = ["BayesianOptimizer", "StepInfo", "StateWrites", "ParticleView", "ParticleOptimizer", "GaussianParticleFlow", "GPF", "IndependentParticles", "GaussianVariationalOptimizer",
           "MGVBP", "MeanFieldVI"]

from bayes_keras.optimizers.svgd import SVGD  # noqa: E402
from bayes_keras.optimizers.matrix_svgd import MatrixSVGD  # noqa: E402
from bayes_keras.optimizers.preconditioned_optimizer import PreconditionedOptimizer  # noqa: E402
from bayes_keras.optimizers.preconditioned_particles import PreconditionedParticles  # noqa: E402

__all__ += ["SVGD", "MatrixSVGD", "PreconditionedOptimizer", "PreconditionedParticles"]
