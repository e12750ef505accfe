"""Curvature, in one package: from what the layers see to the operators the methods use.

- `capture.py`: the layer inputs and pre-activation gradients BayesianModel collects in the forward and
  backward pass when the optimizer asks (`optimizer.curvature_request`).
- `kinds.py` / `rules.py`: what each particle layer class declares (`curvature_rules`): its Kronecker
  structure, its Kronecker factors and its squared per-example gradients.
- `kfac/` (Kronecker structures and factors, one module per layer kind) and `diagonal.py` (squared
  gradients): the formulas.
- `preconditioners/`: the Preconditioner objects (KFAC, Hessian, identity) and the per-step `Curvature`
  operators they return (bayes_keras.preconditioners is this package).
"""

from bayes_keras.curvature.capture import capturing, record
from bayes_keras.curvature.records import CurvatureRequest, LayerRecord
from bayes_keras.curvature.diagonal import per_example_squared_gradients
from bayes_keras.curvature.kinds import LayerCurvature, layer_curvature

__all__ = [
    "CurvatureRequest",
    "LayerCurvature",
    "LayerRecord",
    "capturing",
    "layer_curvature",
    "record",
    "per_example_squared_gradients",
]

from bayes_keras.curvature.capture import is_capturing  # noqa: E402
from bayes_keras.curvature.kfac import (
    KroneckerBlock,
    LayerSpec,
    kfac_factors,
    kronecker_spec,  # noqa: E402
    sampled_negative_log_likelihood,
)

__all__ += [
    "is_capturing",
    "KroneckerBlock",
    "LayerSpec",
    "kfac_factors",
    "kronecker_spec",
    "sampled_negative_log_likelihood",
]

from bayes_keras.curvature import preconditioners  # noqa: E402

__all__ += ["preconditioners"]
