"""Curvature of the log likelihood per particle layer (DESIGN: bayes_keras.curvature).

`capture` collects the layer inputs and pre-activation gradients during BayesianModel.train_step
when the optimizer asks (`optimizer.curvature_request`); the functions here turn them into
curvature estimates.
"""

from bayes_keras.curvature.capture import CurvatureRequest, LayerRecord, capturing, record
from bayes_keras.curvature.diagonal import per_example_squared_gradients
from bayes_keras.curvature.kinds import LayerCurvature, layer_curvature

__all__ = ["CurvatureRequest", "LayerCurvature", "LayerRecord", "capturing", "layer_curvature", "record",
           "per_example_squared_gradients"]

from bayes_keras.curvature.capture import is_capturing  # noqa: E402
from bayes_keras.curvature.kfac import (KroneckerBlock, LayerSpec, kfac_factors, kronecker_spec,  # noqa: E402
                                        sampled_negative_log_likelihood)

__all__ += ["is_capturing", "KroneckerBlock", "LayerSpec", "kfac_factors",
            "kronecker_spec", "sampled_negative_log_likelihood"]
