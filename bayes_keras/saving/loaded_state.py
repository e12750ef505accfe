"""Checks of state read back from a saved file: a value the library would never have written (NaN or Inf,
a non-positive precision) is refused naming the entry it came from, instead of loading silently and
poisoning every prediction or update after it."""

import contextlib

import numpy as np

_REFUSALS = "_bayes_keras_refused_state"


@contextlib.contextmanager
def remembered_refusal(saveable, store):
    """Around a `load_own_variables`: a refusal is remembered on the object, and a later call with an empty
    store re-raises it. Keras' loader retries an object whose loading failed under other attribute paths of
    the model, where the store is empty; without this the retry replaced the refusal by "expected 2
    variables, received 0" (a layer) or skipped the optimizer's state with a warning and loaded the file."""
    refused = getattr(saveable, _REFUSALS, None)
    if refused is not None and not len(store.keys()):
        raise refused
    try:
        yield
    except ValueError as error:
        setattr(saveable, _REFUSALS, error)
        raise


def check_finite_entries(owner, variables, what):
    """Raise a ValueError if a loaded variable holds NaN or Inf: `owner` names the layer / optimizer entry of
    the file, `what` its kind ("layer" / "optimizer")."""
    for index, variable in enumerate(variables):
        value = np.asarray(variable.numpy())
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            bad = int(np.sum(~np.isfinite(value)))
            raise ValueError(
                f"The saved state of {what} '{owner}' is invalid: entry {index} ({variable.path}) holds "
                f"{bad} NaN / Inf value(s) of {value.size}. The file is damaged or was saved from a "
                "run that diverged; it was not loaded into a usable model."
            )


def check_bounded_entry(owner, variable, what, quantity, positive=False, within=None):
    """Raise a ValueError naming the entry if a loaded variable has a negative value (or, with `positive`, a
    value that is not positive; with `within=(low, high)`, one outside it): step counts and second moments are
    never negative, precisions positive."""
    value = np.asarray(variable.numpy())
    if within is not None:
        bad, kind = (
            ~((value >= within[0]) & (value <= within[1])),
            f"value(s) outside [{within[0]:g}, {within[1]:g}]",
        )
    elif positive:
        bad, kind = ~(value > 0), "value(s) that are not positive"
    else:
        bad, kind = ~(value >= 0), "negative value(s)"
    if value.size and np.any(bad):
        shown = value[bad].reshape(-1)[0]
        raise ValueError(
            f"The saved state of {what} '{owner}' is invalid: {variable.path} ({quantity}) has "
            f"{int(np.sum(bad))} {kind} (e.g. {float(shown):.3g})."
        )


def check_positive_definite_entry(owner, variable, what, quantity):
    value = np.asarray(variable.numpy(), np.float64)
    matrices = (
        value.reshape((-1,) + value.shape[-2:]) if value.ndim >= 2 else value.reshape(1, 1, -1)
    )
    for matrix in matrices:
        if matrix.size and (
            not np.allclose(matrix, matrix.T, rtol=1e-6, atol=1e-12)
            or np.linalg.eigvalsh(matrix).min() <= 0
        ):
            raise ValueError(
                f"The saved state of {what} '{owner}' is invalid: {variable.path} ({quantity}) is not "
                "symmetric positive definite."
            )


def load_checked_optimizer_state(optimizer, store, load):
    """An optimizer's `load_own_variables`: Keras' loading (`load`), then every variable finite, the step
    counters bounded, and the optimizer's own `check_loaded_state()`."""
    with remembered_refusal(optimizer, store):
        load(store)
        if len(store.keys()) == len(optimizer.variables):  # Keras skips a state of another size
            check_finite_entries(optimizer.name, optimizer.variables, "optimizer")
            for counter in (optimizer.iterations, optimizer.skipped_updates):
                check_bounded_entry(optimizer.name, counter, "optimizer", "a step count")
            optimizer.check_loaded_state()
