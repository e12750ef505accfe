"""Particle Flow Bayes' Rule (Chen, Dai & Song 2019): a meta-learned ODE operator for sequential
Bayesian updates, its problem families, and the references it is measured against."""

from bayes_keras.pfbr.concat_squash_dense import ConcatSquashDense
from bayes_keras.pfbr.gaussian_mean_problem import GaussianMeanProblem
from bayes_keras.pfbr.gaussian_mixture_problem import GaussianMixtureProblem
from bayes_keras.pfbr.grid_posterior import grid_posterior
from bayes_keras.pfbr.integrator import (
    brute_force_divergence,
    hutchinson_divergence,
    integrate_flow,
)
from bayes_keras.pfbr.linear_dynamical_system_problem import LinearDynamicalSystemProblem
from bayes_keras.pfbr.logistic_regression_problem import LogisticRegressionProblem
from bayes_keras.pfbr.metrics import (
    effective_sample_size,
    gaussian_integral_discrepancies,
    kde_cross_entropy,
    kde_log_density,
    mmd_squared,
    silverman_bandwidth,
    weighted_moments,
)
from bayes_keras.pfbr.output_layer_filter import OutputLayerFilter
from bayes_keras.pfbr.particle_flow_bayes_rule import ParticleFlowBayesRule
from bayes_keras.pfbr.problem import SequentialProblem, autodiff_hessian
from bayes_keras.pfbr.sequential_monte_carlo import (
    SequentialMonteCarlo,
    liu_west_move,
    systematic_resample,
)

__all__ = [
    "ConcatSquashDense",
    "GaussianMeanProblem",
    "GaussianMixtureProblem",
    "grid_posterior",
    "LinearDynamicalSystemProblem",
    "LogisticRegressionProblem",
    "OutputLayerFilter",
    "ParticleFlowBayesRule",
    "SequentialProblem",
    "SequentialMonteCarlo",
    "autodiff_hessian",
    "brute_force_divergence",
    "hutchinson_divergence",
    "integrate_flow",
    "gaussian_integral_discrepancies",
    "kde_cross_entropy",
    "kde_log_density",
    "mmd_squared",
    "silverman_bandwidth",
    "weighted_moments",
    "effective_sample_size",
    "liu_west_move",
    "systematic_resample",
]
