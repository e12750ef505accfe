"""Preconditioners: where matrix-valued SVGD's curvature Q comes from (see base.py for the interface
a KFAC preconditioner implements as well)."""

import keras

from bayes_keras.preconditioners.base import Curvature, Preconditioner
from bayes_keras.preconditioners.dense import (CallablePreconditioner, DenseCurvature, HessianPreconditioner,
                                               hessian_of_negative_log_prob, regularize_curvature)
from bayes_keras.preconditioners.identity import IdentityPreconditioner, ScaledIdentityCurvature

from bayes_keras.preconditioners.kfac import KFACCurvature, KFACPreconditioner  # noqa: E402

_NAMES = {"hessian": HessianPreconditioner, "identity": IdentityPreconditioner, "kfac": KFACPreconditioner}


def get(identifier):
    """A Preconditioner from an instance, a name ("hessian", "identity") or a serialized config."""
    if isinstance(identifier, Preconditioner):
        return identifier
    if isinstance(identifier, str) and identifier.lower() in _NAMES:
        return _NAMES[identifier.lower()]()
    if isinstance(identifier, dict):
        obj = keras.saving.deserialize_keras_object(identifier)
        if isinstance(obj, Preconditioner):
            return obj
    raise ValueError(f"Expected a preconditioner (a bayes_keras.preconditioners.Preconditioner or one of "
                     f"{sorted(_NAMES)}); got {identifier!r}.")


__all__ = ["Preconditioner", "Curvature", "DenseCurvature", "ScaledIdentityCurvature", "CallablePreconditioner",
           "HessianPreconditioner", "IdentityPreconditioner", "regularize_curvature", "hessian_of_negative_log_prob",
           "get"]

__all__ += ["KFACPreconditioner", "KFACCurvature"]
