"""LowerBoundStopping: the MGVBP paper's stopping rule on the smoothed lower bound."""

import collections
import math

import keras
import numpy as np

# keras.src: Keras' message printer, which follows keras.config.disable_interactive_logging (no public one)
from keras.src.utils import io_utils


@keras.saving.register_keras_serializable(package="bayes_keras")
class LowerBoundStopping(keras.callbacks.Callback):
    """Stop training when the moving average of the lower bound has stopped improving.

    The rule of Magris, Shabani & Iosifidis (MGVBP): after every training step t the step's lower
    bound LB_t (per training example, `optimizer.lower_bound`) is recorded; once t >= `window`, the
    smoothed value is the mean of the last `window` values. When it exceeds the best smoothed value
    so far, it becomes the best and the optimizer's `posterior_variables` (the parameters of q) are
    snapshot; otherwise a counter is incremented, and training stops when it reaches `patience`.
    At the end of training the best q is restored and the model's particles are resampled from it.

    The rule reads the optimizer's per-step value, not the "elbo" metric (a running mean over the
    epoch). It works with optimizers that define q explicitly (`bayes_keras.optimizers.MGVBP`,
    `MeanFieldVI`), trained through `BayesianModel.fit`. Steps are counted over the whole `fit` call
    (across epochs); with `steps_per_execution > 1` the rule sees one value per execution.

    Args:
        window: W, the number of steps averaged (paper: 30).
        patience: steps without improvement of the smoothed lower bound before stopping (paper: 20).
        restore_best: at the end of training, put back q from the step of the best smoothed lower
            bound and resample the particles from it.
        verbose: 1 prints one line when training is stopped.

    Attributes:
        best_lower_bound: best smoothed lower bound (None before `window` steps).
        best_step: step (1-based, counted from the start of `fit`) where it was reached.
        stopped_step: step where training was stopped, None if it was not.
        history: smoothed lower bound of every step from step `window` on.

    Example:
        >>> stopper = bayes_keras.callbacks.LowerBoundStopping(window=30, patience=20)
        >>> model.compile(optimizer=bayes_keras.optimizers.MGVBP(1e-2))
        >>> model.fit(x, y, epochs=100, callbacks=[stopper])
        >>> stopper.best_step, stopper.stopped_step
    """

    def __init__(self, window=30, patience=20, restore_best=True, verbose=0):
        super().__init__()
        for name, value in (("window", window), ("patience", patience)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(
                    f"LowerBoundStopping {name} must be a positive integer; got {value!r}."
                )
        self.window = int(window)
        self.patience = int(patience)
        self.restore_best = bool(restore_best)
        self.verbose = int(verbose)
        self._reset()

    def _reset(self):
        self._values = collections.deque(maxlen=self.window)
        self._step = 0
        self._wait = 0
        self._snapshot = None
        self.best_lower_bound = None
        self.best_step = None
        self.stopped_step = None
        self.history = []

    def _optimizer(self):
        optimizer = getattr(self.model, "optimizer", None)
        missing = [
            name
            for name in ("lower_bound", "posterior_variables", "resample")
            if not _has(optimizer, name)
        ]
        if missing:
            raise ValueError(
                f"LowerBoundStopping needs an optimizer that defines q explicitly and reports its lower bound "
                f"(attributes `lower_bound`, `posterior_variables` and `resample`, e.g. "
                f"bayes_keras.optimizers.MGVBP or MeanFieldVI, built by BayesianModel.fit); "
                f"{type(optimizer).__name__} has no {', '.join(f'`{m}`' for m in missing)}."
            )
        return optimizer

    def on_train_begin(self, logs=None):
        self._optimizer()
        self._reset()

    def on_train_batch_end(self, batch, logs=None):
        optimizer = self.model.optimizer
        self._step += 1
        self._values.append(float(keras.ops.convert_to_numpy(optimizer.lower_bound)))
        if self._step < self.window:
            return
        smoothed = math.fsum(self._values) / self.window
        self.history.append(smoothed)
        # A non-finite value in the window (a skipped step) is never an improvement.
        if math.isfinite(smoothed) and (
            self.best_lower_bound is None or smoothed > self.best_lower_bound
        ):
            self.best_lower_bound = smoothed
            self.best_step = self._step
            self._snapshot = [keras.ops.convert_to_numpy(v) for v in optimizer.posterior_variables]
            self._wait = 0
            return
        self._wait += 1
        if self._wait >= self.patience:
            self.model.stop_training = True
            self.stopped_step = self._step
            if self.verbose:
                io_utils.print_msg(
                    f"Step {self._step}: lower bound stopping; best smoothed lower bound "
                    f"{_fmt(self.best_lower_bound)} at step {self.best_step}."
                )

    def on_train_end(self, logs=None):
        if not self.restore_best or self._snapshot is None:
            return
        optimizer = self.model.optimizer
        for variable, value in zip(optimizer.posterior_variables, self._snapshot):
            variable.assign(value)
        optimizer.resample()

    def get_config(self):
        return {
            "window": self.window,
            "patience": self.patience,
            "restore_best": self.restore_best,
            "verbose": self.verbose,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _has(obj, name):
    try:
        return obj is not None and hasattr(obj, name)
    except Exception:
        # a property of an unbuilt optimizer may raise something else than AttributeError
        return False


def _fmt(value):
    return "None" if value is None else f"{value:.6g}"
