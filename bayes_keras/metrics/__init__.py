"""Scores of the posterior predictive: plain functions on numpy arrays and Keras metrics.

Functions (`bayes_keras.metrics.functions`, re-exported here): accuracy, nll, brier, ece,
calibration_curve, evaluate_probs (classification, binary or multi-class); rmse, log_likelihood,
interval_coverage, interval_width (regression); auroc, ood_auroc (out-of-distribution detection).

Keras metrics for `model.compile(metrics=[...])`: ExpectedCalibrationError and BrierScore (on the
predictive probabilities, like Keras' own metrics); ParticleMetric subclasses, which a BayesianModel hands
the per-particle outputs and its likelihood: PredictiveNegativeLogLikelihood (always reported as "nll"),
IntervalCoverage, IntervalWidth.
"""

from bayes_keras.metrics.brier_score import BrierScore
from bayes_keras.metrics.expected_calibration_error import ExpectedCalibrationError
from bayes_keras.metrics.functions import (
    accuracy,
    auroc,
    brier,
    calibration_curve,
    ece,
    evaluate_probs,
    interval_coverage,
    interval_width,
    log_likelihood,
    nll,
    ood_auroc,
    rmse,
)
from bayes_keras.metrics.interval_coverage_metric import IntervalCoverage
from bayes_keras.metrics.interval_width_metric import IntervalWidth
from bayes_keras.metrics.particle_metric import ParticleMetric
from bayes_keras.metrics.predictive_negative_log_likelihood import PredictiveNegativeLogLikelihood

__all__ = [
    "accuracy",
    "nll",
    "brier",
    "ece",
    "calibration_curve",
    "evaluate_probs",
    "rmse",
    "log_likelihood",
    "interval_coverage",
    "interval_width",
    "auroc",
    "ood_auroc",
    "ExpectedCalibrationError",
    "BrierScore",
    "ParticleMetric",
    "PredictiveNegativeLogLikelihood",
    "IntervalCoverage",
    "IntervalWidth",
]
