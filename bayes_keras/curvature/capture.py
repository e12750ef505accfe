"""Capture of the per-layer quantities that curvature approximations need.

KFAC factors and per-example (empirical Fisher / Gauss-Newton) diagonals of a layer are built from
two things: the layer's inputs and the gradients of the loss with respect to its pre-activations.
BayesianModel opens a `capturing()` context around the forward pass when its optimizer asks for
curvature (`optimizer.curvature_request`); every particle layer then reports its input and its
pre-activation tensor through `record`, and the model differentiates the loss with respect to the
recorded pre-activations in the same backward pass as the weights. Outside the context `record`
does nothing, so models trained with other optimizers pay nothing. What a capture produces and the
trainer completes (`LayerRecord`, `finish_records`) and what an optimizer asks for (`CurvatureRequest`)
are in `bayes_keras.curvature.records`.
"""

import contextlib
import threading

from bayes_keras.curvature.records import LayerRecord

_STATE = threading.local()


@contextlib.contextmanager
def capturing():
    """Collect a `LayerRecord` for every particle layer called inside the context.

    Example:
        >>> with capturing() as records:
        ...     outputs = model(x, training=True)
        >>> [r.layer.name for r in records]
    """
    records = []
    previous = getattr(_STATE, "records", None)
    _STATE.records = records
    try:
        yield records
    finally:
        _STATE.records = previous


def is_capturing():
    """True inside `capturing()` (layers may then lay out extra tensors for the record)."""
    return getattr(_STATE, "records", None) is not None


def record(layer, inputs, preactivations):
    """Called by particle layers on their pre-activations; a no-op outside `capturing()`. Returns
    the new `LayerRecord` (None outside), so a layer can add `extras` once they are computed."""
    records = getattr(_STATE, "records", None)
    if records is None:
        return None
    r = LayerRecord(layer, inputs, preactivations)
    records.append(r)
    return r
