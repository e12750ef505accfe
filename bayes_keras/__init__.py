"""bayes_keras: Bayesian deep learning for Keras 3 on TensorFlow Probability.

Layers carry a particle axis on their weights; BayesianModel trains all particles in one pass;
the optimizers in bayes_keras.optimizers are the inference methods.
"""

import sys as _sys

import keras as _keras

if _keras.backend.backend() != "tensorflow":
    raise ImportError(
        f"bayes_keras needs the TensorFlow backend of Keras 3; KERAS_BACKEND is {_keras.backend.backend()!r}."
    )

from bayes_keras import (
    callbacks,
    core,
    curvature,
    datasets,
    layers,
    likelihoods,
    metrics,
    optimizers,
    priors,
    schedules,
    zoo,
)  # noqa: E402
from bayes_keras.core import step_rules  # noqa: E402
from bayes_keras.functional import ParticleRun, run_particles  # noqa: E402
from bayes_keras.model import BayesianModel  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "BayesianModel",
    "callbacks",
    "datasets",
    "zoo",
    "layers",
    "likelihoods",
    "metrics",
    "optimizers",
    "priors",
    "core",
    "step_rules",
    "run_particles",
    "ParticleRun",
    "schedules",
    "curvature",
]

from bayes_keras import kernels, plots, refinement  # noqa: E402
from bayes_keras.saving import export  # noqa: E402
from bayes_keras.curvature import preconditioners  # noqa: E402
from bayes_keras import pfbr  # noqa: E402
from bayes_keras.conversion.bayesianize import bayesianize  # noqa: E402
from bayes_keras.conversion.conversion_report import ConversionReport, conversion_report  # noqa: E402
from bayes_keras.saving.adapters import load_adapters, save_adapters  # noqa: E402
from bayes_keras.conversion import wrappers  # noqa: E402
from bayes_keras.refinement import refine  # noqa: E402
from bayes_keras.saving import loading  # noqa: E402
from bayes_keras.saving.loading import load_model  # noqa: E402
from bayes_keras.training import distribute  # noqa: E402
from bayes_keras import conversion, saving, training  # noqa: E402

__all__ += [
    "bayesianize",
    "save_adapters",
    "load_adapters",
    "conversion_report",
    "ConversionReport",
    "wrappers",
    "pfbr",
    "export",
    "kernels",
    "plots",
    "preconditioners",
    "refinement",
    "refine",
    "load_model",
    "loading",
    "distribute",
    "conversion",
    "saving",
    "training",
]

# The public modules importable at their documented paths (`from bayes_keras.export import export_predictive`,
# `import bayes_keras.distribute`), where they are attributes of the package but live in its subpackages.
for _name, _module in {
    "distribute": distribute,
    "export": export,
    "loading": loading,
    "wrappers": wrappers,
    "step_rules": step_rules,
    "preconditioners": preconditioners,
}.items():
    _sys.modules.setdefault(f"{__name__}.{_name}", _module)
del _name, _module
