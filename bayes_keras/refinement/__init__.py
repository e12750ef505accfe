"""Local refinement of a Gaussian variational posterior with auxiliary variables (Havasi et al. 2021).

`refine(model, x, y)` turns a model trained with a diagonal Gaussian posterior into M refined samples
in its particle slots; `refine_log_prob` does the same on a log density. `auxiliary` holds the closed
forms.
"""

from bayes_keras.refinement import auxiliary
from bayes_keras.refinement.conditional_gaussians import ConditionalGaussians
from bayes_keras.refinement.refine import RefinementHistory, fit_mean_field, refine, refine_log_prob

__all__ = [
    "ConditionalGaussians",
    "RefinementHistory",
    "auxiliary",
    "fit_mean_field",
    "refine",
    "refine_log_prob",
]
