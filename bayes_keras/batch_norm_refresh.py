"""Population statistics for the BatchNormalization layers of a particle network, after training.

In training every particle normalises with its batch's statistics and keeps running averages of them
(momentum 0.9 after `bayesianize`, Keras' 0.99 by default); inference normalises with those averages. The
averages mix statistics of weights the optimizer has since moved, and a posterior method moves weights
every step (a flow's jitter, fresh draws of a Gaussian). Recomputing them for each posterior sample is
the practice of SWA / SWAG (Izmailov et al. 2018, "Averaging Weights
Leads to Wider Optima and Better Generalization", https://arxiv.org/abs/1803.05407, Sec. 3.2; Maddox et al.
2019, "A Simple Baseline for Bayesian Uncertainty in Deep Learning", https://arxiv.org/abs/1902.02476).

`refresh_batch_norm` runs the network in training mode over (at most `max_examples` of) the training
inputs with the weights fixed, and sets every particle's moving mean and variance to the example-weighted
mean of the batches' statistics: the population statistics of the current weights, as Keras' running
averages would reach with a momentum that weights every batch alike. `BayesianModel.fit` calls it at the
end of training (`fit(..., refresh_batch_norm=False)` keeps the running averages).
"""

import keras
import numpy as np
import tensorflow as tf
from keras.src.trainers import data_adapters

from bayes_keras.layers.batch_normalization import BatchNormalization
from bayes_keras.particle_trainer import particle_function

DEFAULT_MAX_EXAMPLES = 4096


def batch_norm_layers(model):
    """The model's particle BatchNormalization layers whose running averages move (momentum < 1)."""
    return [layer for layer in model.particle_layers if isinstance(layer, BatchNormalization) and layer.momentum < 1.0]


def refresh_batch_norm(model, x, batch_size=None, max_examples=DEFAULT_MAX_EXAMPLES):
    """Set the moving statistics of `model`'s BatchNormalization layers to the population statistics of its
    current weights on the inputs `x` (arrays, a dict or list of arrays, a tf.data.Dataset or a PyDataset;
    targets in a dataset are ignored), from the first `max_examples` examples (arrays: evenly spaced ones).
    Returns the number of examples used (0 when the model has no such layers). The weights are not changed;
    Dropout and other training-mode layers act as in training."""
    layers = batch_norm_layers(model)
    if not layers:
        return 0
    if x is None:
        raise ValueError("refresh_batch_norm needs the training inputs x (arrays, a tf.data.Dataset or a PyDataset); "
                         "got None.")
    if isinstance(max_examples, bool) or not isinstance(max_examples, (int, np.integer)) or max_examples < 1:
        raise ValueError(f"refresh_batch_norm: max_examples must be a positive integer; got {max_examples!r}.")
    batched = isinstance(x, (tf.data.Dataset, keras.utils.PyDataset))
    if not batched:
        x = _spread_subset(x, int(max_examples))
    adapter = data_adapters.get_data_adapter(x, batch_size=None if batched else (batch_size or 32), shuffle=False)
    forward = particle_function(model, training=True)
    moving = [(layer, variable) for layer in layers for variable in (layer.moving_mean, layer.moving_variance)]
    totals = [np.zeros(variable.shape, np.float64) for _, variable in moving]
    seen = 0
    for batch in adapter.get_tf_dataset():
        inputs, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        count = int(tf.shape(tf.nest.flatten(inputs)[0])[0])
        if count == 0:
            continue
        before = [variable.numpy() for _, variable in moving]
        forward(inputs)
        for i, ((layer, variable), old) in enumerate(zip(moving, before)):
            # the batch's statistic, recovered from the running-average update it made
            batch_statistic = (variable.numpy().astype(np.float64) - layer.momentum * old) / (1.0 - layer.momentum)
            totals[i] += count * batch_statistic
        seen += count
        if seen >= max_examples:
            break
    if seen == 0:
        raise ValueError("refresh_batch_norm got no examples (an empty x or dataset).")
    for (_, variable), total in zip(moving, totals):
        variable.assign(tf.cast(total / seen, variable.dtype))
    return seen


def _spread_subset(x, max_examples):
    """At most `max_examples` evenly spaced examples of arrays (or a nest of them) with a common first axis."""
    flat = tf.nest.flatten(x)
    size = int(np.shape(flat[0])[0]) if flat else 0
    if size <= max_examples:
        return x
    index = np.linspace(0, size - 1, max_examples).round().astype(np.int64)
    return tf.nest.map_structure(lambda a: tf.gather(a, index) if tf.is_tensor(a) else np.asarray(a)[index], x)
