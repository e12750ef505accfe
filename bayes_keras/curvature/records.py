"""What a curvature capture produces and what an optimizer asks it for.

`CurvatureRequest` is an optimizer's `curvature_request`; `LayerRecord` is what one particle layer reports
in a captured forward pass (`bayes_keras.curvature.capture`), completed by the trainer after the backward
pass with `finish_records`; `sampled_labels_loss` gives the loss of labels sampled from the model (for the
true Fisher).
"""

import dataclasses

import keras
import tensorflow as tf


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


def sampled_labels_loss(likelihood, outputs, seed, sample_weight, scale, rows=None):
    """The summed negative log likelihood of labels sampled from the model (keyed by `seed`), weighted by
    `sample_weight` and multiplied by the float16 loss `scale` (when not None): what the true Fisher's
    second backward pass differentiates. Under tf.distribute (`rows`: the global batch size and this
    replica's first row) the labels are drawn for the global batch (this replica's outputs padded to it)
    and the replica keeps its rows: each example's label is the one a single device draws."""
    if rows is None:
        nll = likelihood.sampled_negative_log_likelihood(outputs, seed)
    else:
        global_batch, first_row = rows
        local = tf.shape(outputs)[0]
        padding = [[first_row, global_batch - first_row - local]] + [[0, 0]] * (
            len(outputs.shape) - 1
        )
        nll = likelihood.sampled_negative_log_likelihood(tf.pad(outputs, padding), seed)
        nll = nll[first_row : first_row + local]
    if sample_weight is not None:
        nll = nll * tf.cast(tf.reshape(sample_weight, (-1, 1)), nll.dtype)
    loss = tf.reduce_sum(nll)
    return loss if scale is None else loss * scale


def of_this_graph(tensor):
    """Whether `tensor` belongs to the running computation (eager, or the current graph or one enclosing it)."""
    if isinstance(tensor, keras.KerasTensor):
        return False
    if not tf.is_symbolic_tensor(tensor):
        return tf.executing_eagerly()
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        if graph is tensor.graph:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False
