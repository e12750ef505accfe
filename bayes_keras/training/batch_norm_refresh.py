"""Population statistics for the BatchNormalization layers of a particle network, after training.

In training every particle normalises with its batch's statistics and keeps running averages of them
(momentum 0.9 after `bayesianize`, Keras' 0.99 by default); inference normalises with those averages. The
averages mix statistics of weights the optimizer has since moved, and a posterior method moves weights
every step (a flow's jitter, fresh draws of a Gaussian). Recomputing them for each posterior sample is
the practice of SWA / SWAG (Izmailov et al. 2018, "Averaging Weights
Leads to Wider Optima and Better Generalization", https://arxiv.org/abs/1803.05407, Sec. 3.2; Maddox et al.
2019, "A Simple Baseline for Bayesian Uncertainty in Deep Learning", https://arxiv.org/abs/1902.02476).

`refresh_batch_norm` sets every particle's moving mean and variance, per channel, to the population
statistics of the layer's inputs over the refresh set (at most `max_examples` training inputs), with the
weights fixed:

    mean = E[x],    variance = E[x^2] - E[x]^2,

the expectations over every example of the set (and every spatial or time position), from sums of x and
x^2 accumulated in float64 over all batches. This is the statistic of Ioffe & Szegedy's inference step
("Batch Normalization: Accelerating Deep Network Training by Reducing Internal Covariate Shift",
https://arxiv.org/abs/1502.03167, Algorithm 1, step 10, without its n/(n-1): Keras normalises with the
biased variance, and over thousands of values the two agree to 1/n). It does not depend on the batch
size, unlike an average of per-batch biased variances ((B-1)/B of the population's at batch size B).

Every layer other than the refreshed BatchNormalization layers runs in inference mode during the refresh
(no Dropout, no noise layers). How the BatchNormalization layers before layer k normalise decides layer
k's inputs; two choices:

- `layerwise=False` (default): one pass over the refresh set, in which every refreshed layer normalises
  with its batch's statistics, as in training (the pass of SWA's bn_update), without updating its moving
  averages, and records its input x (`bayes_keras.layers.batch_normalization.batch_statistics_pass`);
  every layer's sums are pooled over all batches of that pass. Layer k's statistics are then those of
  inputs normalised upstream by batch statistics, which inference does not produce exactly (they depend a
  little on the batch size); the first layer's are exact. The cost is one pass, whatever the number of
  layers. Decision: the default, because fit runs it at the end of every training and a converted network
  has tens of BatchNormalization layers (MobileNetV2 52).
- `layerwise=True`: the layers are refreshed one at a time in the order the forward pass calls them, and
  layer k's inputs are computed in inference mode with the layers before it already normalising with their
  refreshed statistics, so its statistics are those of the inputs it receives in the network as it runs
  at inference, which is what inference normalises. The cost is one inference pass over the refresh set
  per refreshed layer (compiled once). The inputs are read through the curvature capture: in inference
  mode a particle BatchNormalization records its normalised input z = (x - m) / sqrt(v + epsilon); while
  a layer is refreshed its moving statistics are set to m = 0 and v = 1, so x = z sqrt(1 + epsilon).

Either way a layer called more than once pools the inputs of all its calls (and takes its place from its
first call), and frozen layers (`trainable=False`) and layers with momentum 1 keep their statistics (and
normalise with them during the pass). The one pass assigns nothing unless it completes; layerwise, a layer
whose pass fails gets its statistics back. `BayesianModel.fit` calls `refresh_batch_norm` (one pass) at
the end of training (`fit(..., refresh_batch_norm=False)` keeps the running averages), so the `val_*`
figures of every epoch, the last included, and the checkpoints written during fit saw the running
averages; the model fit returns has the refreshed statistics.
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf

# keras.src: fit's own iteration over arrays, datasets and generators (no public data-adapter API)
from keras.src.trainers import data_adapters

from bayes_keras.curvature import capture
from bayes_keras.layers.particle_layout import particle_axis
from bayes_keras.layers.batch_normalization import BatchNormalization, batch_statistics_pass

DEFAULT_MAX_EXAMPLES = 4096


def batch_norm_layers(model):
    """The model's particle BatchNormalization layers whose running averages move in training (momentum < 1,
    not frozen: a frozen layer keeps its statistics, as Keras' BatchNormalization does)."""
    return [
        layer
        for layer in model.particle_layers
        if isinstance(layer, BatchNormalization) and layer.momentum < 1.0 and layer.trainable
    ]


def refresh_batch_norm(
    model, x, batch_size=None, max_examples=DEFAULT_MAX_EXAMPLES, layerwise=False
):
    """Set the moving statistics of `model`'s BatchNormalization layers to the population statistics of their
    inputs (mean E[x] and biased variance E[x^2] - E[x]^2 per particle and channel, over all examples and
    positions) for the current weights, from the first `max_examples` examples of `x` (arrays, a dict or
    list of arrays, a tf.data.Dataset or a PyDataset; targets in a dataset are ignored; arrays: evenly spaced
    examples). Every other layer runs in inference mode (no dropout).

    `layerwise=False` (default): one pass over the examples, in which every refreshed BatchNormalization
    layer normalises with its batch's statistics (as in training, SWA's bn_update) without moving its
    averages; each layer's statistics are pooled over all batches of that pass. `layerwise=True`: the
    layers are refreshed one at a time in call order, each with the earlier ones already normalising with
    their refreshed statistics, so each layer's statistics are those of the inputs it receives at inference
    (one inference pass over the examples per layer; a dataset is read once per layer, so it should yield
    the same examples each time). Returns the number of examples used (0 when the model has no such
    layers). The weights are not changed."""
    if not isinstance(layerwise, bool):
        raise ValueError(f"refresh_batch_norm: layerwise must be True or False; got {layerwise!r}.")
    layers = batch_norm_layers(model)
    if not layers:
        return 0
    if x is None:
        raise ValueError(
            "refresh_batch_norm needs the training inputs x (arrays, a tf.data.Dataset or a PyDataset); "
            "got None."
        )
    if (
        isinstance(max_examples, bool)
        or not isinstance(max_examples, (int, np.integer))
        or max_examples < 1
    ):
        raise ValueError(
            f"refresh_batch_norm: max_examples must be a positive integer; got {max_examples!r}."
        )
    max_examples = int(max_examples)
    batched = isinstance(x, (tf.data.Dataset, keras.utils.PyDataset))
    if not batched:
        x = _spread_subset(x, max_examples)
    adapter = data_adapters.get_data_adapter(
        x, batch_size=None if batched else (batch_size or 32), shuffle=False
    )
    if layerwise:
        return _refresh_layerwise(model, layers, adapter, max_examples)
    sums, seen, totals = _InputSums(model, layers, batch_statistics=True), 0, None
    for inputs, count in _batches(adapter, max_examples):  # the one pass
        part = [[value.numpy() for value in layer_sums] for layer_sums in sums(None, inputs)]
        totals = (
            part
            if totals is None
            else [[a + b for a, b in zip(t, p)] for t, p in zip(totals, part)]
        )
        seen += count
    if totals is None:
        raise ValueError("refresh_batch_norm got no examples (an empty x or dataset).")
    for layer, layer_totals in zip(sums.layers, totals):
        _assign(layer, layer_totals, scale=1.0)  # the recorded values are the inputs x themselves
    return seen


def _refresh_layerwise(model, layers, adapter, max_examples):
    """`refresh_batch_norm(..., layerwise=True)`: one inference pass per layer, in call order."""
    first = next(_batches(adapter, max_examples), None)
    if first is None:
        raise ValueError("refresh_batch_norm got no examples (an empty x or dataset).")
    sums = _InputSums(model, layers, batch_statistics=False)
    sums.trace(first[0])  # `sums.layers` known
    seen = 0
    for index, layer in enumerate(sums.layers):
        saved = [layer.moving_mean.numpy(), layer.moving_variance.numpy()]
        # z = x / sqrt(1 + epsilon) in this pass
        layer.moving_mean.assign(tf.zeros_like(layer.moving_mean))
        layer.moving_variance.assign(tf.ones_like(layer.moving_variance))
        try:
            seen, totals = 0, None
            for inputs, count in _batches(adapter, max_examples):
                part = [value.numpy() for value in sums(index, inputs)]
                totals = part if totals is None else [a + b for a, b in zip(totals, part)]
                seen += count
        except BaseException:
            layer.moving_mean.assign(saved[0])
            layer.moving_variance.assign(saved[1])
            raise
        _assign(layer, totals, scale=1.0 + layer.epsilon)
    return seen


def _assign(layer, totals, scale):
    """Moving mean and variance from (values, sum z, sum z^2) of recorded values z = x / sqrt(scale)."""
    values, first_sum, second_sum = totals
    mean = first_sum / values
    variance = np.maximum(second_sum / values - np.square(mean), 0.0)
    layer.moving_mean.assign(tf.cast(mean * np.sqrt(scale), layer.moving_mean.dtype))
    layer.moving_variance.assign(tf.cast(variance * scale, layer.moving_variance.dtype))


class _InputSums:
    """The pass, compiled once on the first batch's shapes, and the sums of the refreshed layers' recorded
    inputs over all their calls: (values per particle and channel, float64 sums of z and of z^2, each
    (N, C)). `batch_statistics=True`: the one pass, every candidate layer normalising with batch statistics
    and recording its input x, the sums of every layer returned; False: the inference pass, only the
    `index`-th layer's sums returned. `layers`: the refreshed layers the pass calls, in the order of their
    first calls (a layer it never calls keeps its statistics); known once traced."""

    def __init__(self, model, layers, batch_statistics):
        self.model, self.candidates, self.layers = model, layers, []
        self.batch_statistics, self.function = batch_statistics, None

    def trace(self, example):
        specs = tf.nest.map_structure(
            lambda t: tf.TensorSpec((None,) + tuple(t.shape[1:]), t.dtype), example
        )
        self.function = tf.function(
            self._sums, input_signature=[tf.TensorSpec((), tf.int32), specs]
        )
        self.function.get_concrete_function()

    def _sums(self, index, inputs):
        with contextlib.ExitStack() as stack:
            if self.batch_statistics:
                stack.enter_context(batch_statistics_pass(self.candidates))
            records = stack.enter_context(capture.capturing())
            self.model(inputs, training=False)  # Dropout and other layers in inference mode
        calls = {}
        for record in records:
            if any(record.layer is layer for layer in self.candidates):
                if id(record.layer) not in calls:
                    self.layers.append(record.layer)
                calls.setdefault(id(record.layer), []).append(record.inputs)
        if self.batch_statistics:
            return [_moment_sums(calls[id(layer)]) for layer in self.layers]
        # only the requested layer's sums are computed (the pass itself runs whole)
        return tf.switch_case(
            index, [lambda inputs=calls[id(layer)]: _moment_sums(inputs) for layer in self.layers]
        )

    def __call__(self, index, inputs):
        """The batch `inputs`' sums: of every layer of `layers` (batch_statistics), or of the `index`-th."""
        if self.function is None:
            self.trace(inputs)
        return self.function(tf.constant(index or 0, tf.int32), inputs)


def _moment_sums(calls):
    """(values per particle and channel, sum of z, sum of z^2), float64, over the recorded inputs z of a
    layer's calls, each (batch, N, ..., C) or (batch, H, W, N, C)."""
    values = sums = squares = 0.0
    for z in calls:
        z = tf.cast(z, tf.float64)
        rank = len(z.shape)
        axes = [a for a in range(rank - 1) if a != particle_axis(rank)]
        values += tf.cast(tf.reduce_prod(tf.gather(tf.shape(z), axes)), tf.float64)
        sums += tf.reduce_sum(z, axis=axes)
        squares += tf.reduce_sum(tf.square(z), axis=axes)
    return values, sums, squares


def _batches(adapter, max_examples):
    """(inputs, count) of the adapter's non-empty batches, up to `max_examples` examples in all (the last
    batch cut to fit)."""
    seen = 0
    for batch in adapter.get_tf_dataset():
        inputs, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        count = int(tf.shape(tf.nest.flatten(inputs)[0])[0])
        if count == 0:
            continue
        if seen + count > max_examples:
            count = max_examples - seen
            inputs = tf.nest.map_structure(lambda a, c=count: a[:c], inputs)
        yield inputs, count
        seen += count
        if seen >= max_examples:
            return


def _spread_subset(x, max_examples):
    """At most `max_examples` evenly spaced examples of arrays (or a nest of them) with a common first axis."""
    flat = tf.nest.flatten(x)
    size = int(np.shape(flat[0])[0]) if flat else 0
    if size <= max_examples:
        return x
    index = np.linspace(0, size - 1, max_examples).round().astype(np.int64)
    return tf.nest.map_structure(
        lambda a: tf.gather(a, index) if tf.is_tensor(a) else np.asarray(a)[index], x
    )
