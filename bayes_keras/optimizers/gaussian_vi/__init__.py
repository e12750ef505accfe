"""Gaussian variational inference: an explicit posterior q = N(mu, P^-1), the model's particles its samples.

- `gaussian_variational_optimizer.py`: the shared machinery (q's blocks, sampling, the ELBO, the posterior).
- `mgvbp.py`: MGVBP, natural gradients on the precision (Magris et al.): the class users construct and what
  its structures share; one file per structure, each with its posterior family and its estimators:
  `mgvbp_diagonal.py` (networks), `mgvbp_full.py` (small models), `mgvbp_kronecker.py` (per layer
  A (x) G); `precision_manifold.py` the retraction and transport of dense precisions.
- `mean_field_vi.py`: MeanFieldVI, Bayes by Backprop (Blundell et al. 2015), on `softplus_gaussian.py`.
- `gaussian_family.py`: the interface of a posterior family (one object per block of weights: its
  variables, sampling, entropy, distribution and step).
"""

from bayes_keras.optimizers.gaussian_vi.gaussian_family import GaussianFamily
from bayes_keras.optimizers.gaussian_vi.gaussian_variational_optimizer import (
    GaussianVariationalOptimizer,
)
from bayes_keras.optimizers.gaussian_vi.mean_field_vi import MeanFieldVI
from bayes_keras.optimizers.gaussian_vi.mgvbp import MGVBP
from bayes_keras.optimizers.gaussian_vi.mgvbp_diagonal import DiagonalGaussian, MGVBPDiagonal
from bayes_keras.optimizers.gaussian_vi.mgvbp_full import FullGaussian, MGVBPFull
from bayes_keras.optimizers.gaussian_vi.mgvbp_kronecker import KroneckerGaussian, MGVBPKronecker
from bayes_keras.optimizers.gaussian_vi.softplus_gaussian import SoftplusGaussian

__all__ = [
    "GaussianVariationalOptimizer",
    "MGVBP",
    "MGVBPDiagonal",
    "MGVBPFull",
    "MGVBPKronecker",
    "MeanFieldVI",
    "GaussianFamily",
    "DiagonalGaussian",
    "FullGaussian",
    "KroneckerGaussian",
    "SoftplusGaussian",
]
