"""Preconditioners: where matrix-valued SVGD's curvature Q comes from (the interface a KFAC preconditioner
implements as well: base.py for the `Preconditioner`, curvature.py for the `Curvature` it returns)."""

from bayes_keras.curvature.preconditioners.base import Preconditioner
from bayes_keras.curvature.preconditioners.curvature import Curvature
from bayes_keras.curvature.preconditioners.dense import (
    CallablePreconditioner,
    DenseCurvature,
    HessianPreconditioner,
    hessian_of_negative_log_prob,
    regularize_curvature,
)
from bayes_keras.curvature.preconditioners.identity import (
    IdentityPreconditioner,
    ScaledIdentityCurvature,
)

from bayes_keras.curvature.preconditioners.kfac_preconditioner import (
    KFACCurvature,
    KFACPreconditioner,
)  # noqa: E402
from bayes_keras.curvature.preconditioners.preconditioning import (
    default_preconditioner,
    get,  # noqa: E402
    require_finite_curvature,
    step_records,
)


__all__ = [
    "Preconditioner",
    "Curvature",
    "DenseCurvature",
    "ScaledIdentityCurvature",
    "CallablePreconditioner",
    "HessianPreconditioner",
    "IdentityPreconditioner",
    "regularize_curvature",
    "hessian_of_negative_log_prob",
    "get",
    "default_preconditioner",
    "step_records",
    "require_finite_curvature",
]

__all__ += ["KFACPreconditioner", "KFACCurvature"]
