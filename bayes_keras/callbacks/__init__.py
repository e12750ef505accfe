"""Keras callbacks for Bayesian training."""

from bayes_keras.callbacks.backup_and_restore import BackupAndRestore
from bayes_keras.callbacks.lower_bound_stopping import LowerBoundStopping

__all__ = ["BackupAndRestore", "LowerBoundStopping"]
