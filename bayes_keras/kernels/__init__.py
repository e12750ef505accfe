"""SVGD kernels: small serializable objects returning the Gram matrix and the repulsion term in
closed form (see bayes_keras.kernels.kernel for the conventions)."""

from bayes_keras._config import resolve
from bayes_keras.kernels.centred_linear import CentredLinear
from bayes_keras.kernels.imq import IMQ
from bayes_keras.kernels.kernel import (
    Kernel,
    RadialKernel,
    median_offdiagonal,
    pairwise_sq_distances,
)
from bayes_keras.kernels.rbf import RBF

CenteredLinear = CentredLinear

_NAMES = {
    "rbf": RBF,
    "imq": IMQ,
    "centred_linear": CentredLinear,
    "centered_linear": CentredLinear,
    "linear": CentredLinear,
}


def get(identifier):
    """A Kernel from a Kernel, a name ("rbf", "imq", "centred_linear") or a serialized config."""
    return resolve(
        identifier, Kernel, _NAMES, "a kernel (a bayes_keras.kernels.Kernel", default=RBF
    )


__all__ = [
    "Kernel",
    "RadialKernel",
    "RBF",
    "IMQ",
    "CentredLinear",
    "CenteredLinear",
    "get",
    "median_offdiagonal",
    "pairwise_sq_distances",
]
