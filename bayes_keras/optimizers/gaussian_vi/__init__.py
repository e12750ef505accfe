"""Gaussian variational inference: an explicit posterior q = N(mu, P^-1), the model's particles its samples.

- `gaussian_variational_optimizer.py`: the shared machinery (q's blocks, sampling, the ELBO, the posterior).
- `mgvbp.py`: MGVBP, natural gradients on the precision (Magris et al.); `natural_gradients.py` its math;
  `curvature_targets.py` its Fisher and Kronecker curvature targets (curvature="empirical_fisher" / "fisher").
- `mean_field_vi.py`: MeanFieldVI, Bayes by Backprop (Blundell et al. 2015).
- The posterior families, one object per block of weights (over `GaussianFamily`): each owns its variables,
  sampling, entropy, distribution and step. `DiagonalGaussian`, `FullGaussian`, `KroneckerGaussian`: MGVBP's
  natural-gradient step on the manifold of their precisions; `SoftplusGaussian`: MeanFieldVI's Adam on
  (mu, rho).
"""

from bayes_keras.optimizers.gaussian_vi.diagonal_gaussian import DiagonalGaussian
from bayes_keras.optimizers.gaussian_vi.full_gaussian import FullGaussian
from bayes_keras.optimizers.gaussian_vi.gaussian_family import GaussianFamily
from bayes_keras.optimizers.gaussian_vi.gaussian_variational_optimizer import (
    GaussianVariationalOptimizer,
)
from bayes_keras.optimizers.gaussian_vi.kronecker_gaussian import KroneckerGaussian
from bayes_keras.optimizers.gaussian_vi.mean_field_vi import MeanFieldVI
from bayes_keras.optimizers.gaussian_vi.mgvbp import MGVBP
from bayes_keras.optimizers.gaussian_vi.softplus_gaussian import SoftplusGaussian

__all__ = [
    "GaussianVariationalOptimizer",
    "MGVBP",
    "MeanFieldVI",
    "GaussianFamily",
    "DiagonalGaussian",
    "FullGaussian",
    "KroneckerGaussian",
    "SoftplusGaussian",
]
