"""Capture of the per-layer quantities that curvature approximations need.

KFAC factors and per-example (empirical Fisher / Gauss-Newton) diagonals of a layer are built from
two things: the layer's inputs and the gradients of the loss with respect to its pre-activations.
BayesianModel opens a `capturing()` context around the forward pass when its optimizer asks for
curvature (`optimizer.curvature_request`); every particle layer then reports its input and its
pre-activation tensor through `record`, and the model differentiates the loss with respect to the
recorded pre-activations in the same backward pass as the weights. Outside the context `record`
does nothing, so models trained with other optimizers pay nothing.
"""

import contextlib
import dataclasses
import threading

import tensorflow as tf

_STATE = threading.local()


@dataclasses.dataclass
class LayerRecord:
    """What one particle layer saw in one forward pass.

    Attributes:
        layer: the particle layer.
        inputs: its input, (batch, ...) when the layer starts the particle axis, else (batch, N, ...).
        preactivations: its output before the activation, (batch, N, ...).
        output_gradients: per-example gradients of the NEGATIVE log likelihood of each example (not
            scaled to the data set, not tempered) with respect to `preactivations`; filled in by the
            model after the backward pass.
        dataset_scale: n_train / (batch * temperature): the sum over the data set of a per-example
            quantity, tempered, is estimated by dataset_scale * (sum over the batch).
        sampled_output_gradients: like `output_gradients` but for labels sampled from the model's own
            predictive, y~_bn ~ p(y | x_b, w_n) (for the true Fisher); filled in only when the
            optimizer's `curvature_request` asks for sampled labels (`CurvatureRequest.labels`).
        temperature: the model's posterior temperature (filled in with `dataset_scale`).
        extras: layer-specific tensors, laid out (batch, N, ...) like `preactivations` (recurrent
            layers: "recurrent_inputs" h_{t-1}, and for GRU "reset_gates" r_t or
            "reset_recurrent_inputs" r_t * h_{t-1}; see bayes_keras.curvature.kfac).
    """

    layer: object
    inputs: tf.Tensor
    preactivations: tf.Tensor
    output_gradients: tf.Tensor = None
    dataset_scale: tf.Tensor = None
    sampled_output_gradients: tf.Tensor = None
    temperature: float = None
    extras: dict = None


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


@dataclasses.dataclass(frozen=True)
class CurvatureRequest:
    """What an optimizer asks BayesianModel to capture in the forward pass (its `curvature_request`).

    Both kinds of statistics come from the same capture, every particle layer's inputs and the
    per-example gradients at its pre-activations; `statistics` says which formulas the optimizer will
    apply to them (the layers' `curvature_rules`).

    Attributes:
        statistics: "kronecker_factors" (KFAC's A and G) or "squared_gradients" (per-example squared
            gradients: the empirical Fisher's diagonal).
        labels: "observed" (the empirical Fisher, from the training labels) or "sampled" (the true
            Fisher: labels drawn from the model's own predictive, one per example and particle, cost a
            second backward pass to the pre-activations; `LayerRecord.sampled_output_gradients`).
    """

    statistics: str
    labels: str = "observed"

    def __post_init__(self):
        if self.statistics not in STATISTICS:
            raise ValueError(
                f"CurvatureRequest statistics must be one of {STATISTICS}; got {self.statistics!r}."
            )
        if self.labels not in LABELS:
            raise ValueError(
                f"CurvatureRequest labels must be one of {LABELS}; got {self.labels!r}."
            )

    @property
    def samples_labels(self):
        return self.labels == "sampled"


STATISTICS = ("kronecker_factors", "squared_gradients")
LABELS = ("observed", "sampled")


def record(layer, inputs, preactivations):
    """Called by particle layers on their pre-activations; a no-op outside `capturing()`. Returns
    the new `LayerRecord` (None outside), so a layer can add `extras` once they are computed."""
    records = getattr(_STATE, "records", None)
    if records is None:
        return None
    r = LayerRecord(layer, inputs, preactivations)
    records.append(r)
    return r


def finish_records(
    records, preactivation_grads, batch, dtype, dataset_size, temperature, sampled_grads=None
):
    """Turn d loss / d preactivation into per-example gradients of -log p(y_b | x_b, w_n), in place.

    loss = -sum_n log_joint_n has d loss / d z_bn = -(n_train / (batch T)) d log p(y_b | w_n) / d z_bn.
    `sampled_grads` (true Fisher) are already per-example gradients of -log p(y~_bn | x_b, w_n).
    """
    scale = float(dataset_size) / (tf.cast(batch, dtype) * temperature)
    for i, (r, g) in enumerate(zip(records, preactivation_grads)):
        if g is None:
            raise ValueError(
                f"Layer '{r.layer.name}' does not influence the loss; curvature cannot be "
                "computed for it."
            )
        # Curvature statistics in the variables' dtype (float16 sums of a a^T would overflow).
        r.inputs = tf.cast(r.inputs, dtype)
        r.extras = None if r.extras is None else {k: tf.cast(v, dtype) for k, v in r.extras.items()}
        r.output_gradients = tf.cast(g, dtype) / scale
        r.dataset_scale = scale
        r.temperature = temperature
        if sampled_grads is not None:
            r.sampled_output_gradients = tf.cast(sampled_grads[i], dtype)
