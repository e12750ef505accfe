"""Preconditioners: where matrix-valued SVGD's curvature Q comes from (see base.py for the interface
a KFAC preconditioner implements as well)."""

from bayes_keras._config import resolve
from bayes_keras.preconditioners.base import Curvature, Preconditioner
from bayes_keras.preconditioners.dense import (CallablePreconditioner, DenseCurvature, HessianPreconditioner,
                                               hessian_of_negative_log_prob, regularize_curvature)
from bayes_keras.preconditioners.identity import IdentityPreconditioner, ScaledIdentityCurvature

from bayes_keras.preconditioners.kfac import KFACCurvature, KFACPreconditioner  # noqa: E402

_NAMES = {"hessian": HessianPreconditioner, "identity": IdentityPreconditioner, "kfac": KFACPreconditioner}


def get(identifier):
    """A Preconditioner from an instance, a name ("hessian", "identity") or a serialized config."""
    return resolve(identifier, Preconditioner, _NAMES,
                   "a preconditioner (a bayes_keras.preconditioners.Preconditioner")


__all__ = ["Preconditioner", "Curvature", "DenseCurvature", "ScaledIdentityCurvature", "CallablePreconditioner",
           "HessianPreconditioner", "IdentityPreconditioner", "regularize_curvature", "hessian_of_negative_log_prob",
           "get"]

__all__ += ["KFACPreconditioner", "KFACCurvature"]
