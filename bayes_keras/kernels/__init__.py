"""SVGD kernels: small serializable objects returning the Gram matrix and the repulsion term in
closed form (see bayes_keras.kernels.kernel for the conventions)."""

from bayes_keras.kernels.centred_linear import CentredLinear
from bayes_keras.kernels.imq import IMQ
from bayes_keras.kernels.kernel import Kernel, RadialKernel, get, median_offdiagonal, pairwise_sq_distances
from bayes_keras.kernels.rbf import RBF

CenteredLinear = CentredLinear

__all__ = ["Kernel", "RadialKernel", "RBF", "IMQ", "CentredLinear", "CenteredLinear", "get", "median_offdiagonal",
           "pairwise_sq_distances"]
