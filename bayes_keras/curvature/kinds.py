"""What a particle layer class declares about its curvature, and how the curvature code looks it up.

A layer class declares its formulas as the class attribute `curvature_rules` (a `LayerCurvature`;
bayes_keras.curvature.rules has those of the shipped layers). Subclasses inherit it, so a user's
`class MyDense(bayes_keras.layers.Dense)` gets Dense's curvature, and a new layer type gets curvature
by declaring its own rules, with no change to the curvature code. Likelihoods declare label sampling
for the true Fisher as a method (`Likelihood.sampled_negative_log_likelihood`).
"""

import dataclasses
from typing import Callable, Optional

# the shipped layer kinds with Kronecker (KFAC) formulas
SUPPORTED_LAYERS = (
    "Dense",
    "Conv1D",
    "Conv2D",
    "SimpleRNN",
    "LSTM",
    "GRU",
    "Embedding",
    "BatchNormalization",
)


@dataclasses.dataclass(frozen=True)
class LayerCurvature:
    """The curvature formulas of one particle layer type.

    Attributes:
        kind: the type's name in messages and in Kronecker specs ("Dense", "Conv2D", ...).
        kronecker_spec: layer -> `bayes_keras.curvature.kfac.LayerSpec` (its Kronecker blocks), or None
            when KFAC does not support the type.
        kronecker_factors: (layer, record, output_gradients, dataset_scale) -> {factor name: (N, d, d)}.
        squared_gradients: (layer, inputs, output_gradients) -> (kernel, bias) batch sums of squared
            per-example gradients (the empirical Fisher's diagonal), or None when not supported.
    """

    kind: str
    kronecker_spec: Optional[Callable] = None
    kronecker_factors: Optional[Callable] = None
    squared_gradients: Optional[Callable] = None


def layer_curvature(layer):
    """The `LayerCurvature` a layer's class declares (None: no curvature formulas)."""
    # the class's, or None set by an instance (grouped Conv2D)
    rules = getattr(layer, "curvature_rules", None)
    return rules if isinstance(rules, LayerCurvature) else None


def layer_kind(layer):
    """The declared kind ("Dense", "Conv2D", "SimpleRNN", "LSTM", "GRU" for the shipped layers and their
    subclasses); otherwise the class name (which the callers report as unsupported)."""
    rules = layer_curvature(layer)
    return rules.kind if rules is not None else type(layer).__name__


def kronecker_rules(layer):
    """The `LayerCurvature` a layer declares, when it has a Kronecker spec (else ValueError)."""
    rules = layer_curvature(layer)
    if rules is None or rules.kronecker_spec is None:
        raise ValueError(
            f"KFAC supports the particle layers {', '.join(SUPPORTED_LAYERS)}; layer "
            f"'{getattr(layer, 'name', repr(layer))}' is a {layer_kind(layer)}."
        )
    return rules
