"""Gaussian families of an explicit posterior q = N(mu, P^-1), one object per block of weights.

Each family owns the math of its precision's shape (diagonal, full, Kronecker-factored): the
variables a block needs, sampling, entropy, the TFP distribution, and MGVBP's step on the manifold
of its precisions. The optimizer (bayes_keras.optimizers.MGVBP) chooses the family and estimates the
natural gradients; the family applies them.
"""

from bayes_keras.posteriors.diagonal_gaussian import DiagonalGaussian
from bayes_keras.posteriors.full_gaussian import FullGaussian
from bayes_keras.posteriors.gaussian_family import GaussianFamily
from bayes_keras.posteriors.kronecker_gaussian import KroneckerGaussian

__all__ = ["GaussianFamily", "DiagonalGaussian", "FullGaussian", "KroneckerGaussian"]
