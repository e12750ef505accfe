"""Per-example squared gradients of a layer's weights: the diagonal of the empirical Fisher.

For example b and particle n, the gradient of -log p(y_b | x_b, w_n) with respect to a Dense
kernel is the outer product a_b e_b^T of the layer input and the pre-activation gradient (summed
over locations when the layer is applied at several positions, as a convolution is). The diagonal
of the empirical Fisher is the batch sum of its elementwise square. This is the curvature that
VOGN / Vadam-style natural-gradient VI uses for networks (Khan et al. 2018, Osawa et al. 2019):
unlike a Stein or Hessian estimate it is never negative.
"""

import tensorflow as tf

from bayes_keras.curvature.kfac.batch_normalization import scale_shift_gradients
from bayes_keras.curvature.kfac.conv import conv1d_patches, conv_patches
from bayes_keras.curvature.kfac.embedding import embedding_locations
from bayes_keras.curvature.kinds import layer_curvature, layer_kind


def per_example_squared_gradients(record, labels="observed"):
    """Batch sums of squared per-example gradients for the particle variables of one layer.

    Args:
        record: a `LayerRecord` with `output_gradients` filled in.
        labels: "observed" (the empirical Fisher) or "sampled" (labels drawn from the model's own
            predictive, one per example and particle: a Monte Carlo estimate of the true Fisher's
            diagonal; needs `sampled_output_gradients`).

    Returns:
        A list of (variable, tensor) pairs; each tensor has the variable's (N, ...) shape and holds
        sum_b (d -log p(y_b | x_b, w_n) / d w_n)^2 (not scaled to the data set).
    """
    if labels not in ("observed", "sampled"):
        raise ValueError(f"labels must be 'observed' or 'sampled'; got {labels!r}.")
    layer = record.layer
    grads = record.output_gradients if labels == "observed" else record.sampled_output_gradients
    if grads is None:
        raise ValueError(
            f"The record of '{layer.name}' has no {labels}-label pre-activation gradients."
        )
    rules = layer_curvature(layer)
    if rules is None or rules.squared_gradients is None:
        raise NotImplementedError(
            f"Per-example squared gradients are implemented for Dense, Conv1D, Conv2D, Embedding and BatchNormalization "
            f"particle layers; got {layer_kind(layer)} ('{layer.name}')."
        )
    kernel, bias = rules.squared_gradients(layer, record.inputs, grads)
    weights = [v for v, _, _ in layer.prior_terms]  # the kernel (or table), then the bias if any
    out = [(weights[0], tf.reshape(kernel, weights[0].shape))]
    if len(weights) > 1:  # a bias (or BatchNormalization's beta)
        out.append((weights[1], bias))
    return out


def dense_squared_gradients(layer, x, e):
    """(kernel, bias) squared-gradient sums of a Dense particle layer."""
    n, units = layer.kernel.shape[0], layer.units
    batch = tf.shape(e)[0]
    e = tf.reshape(e, (batch, n, -1, units))  # (B, N, L, out): L locations (1 for a plain Dense)
    in_dim = layer.kernel.shape[1]
    if layer.broadcasts:
        a = tf.reshape(x, (batch, 1, -1, in_dim))
    else:
        a = tf.reshape(x, (batch, n, -1, in_dim))
    if e.shape[2] == 1:  # one location: (a e^T)^2 = a^2 (e^2)^T, no per-example tensor needed
        a2, e2 = tf.square(a[:, :, 0]), tf.square(e[:, :, 0])
        if layer.broadcasts:
            kernel = tf.einsum("bzi,bno->nio", a2, e2)
        else:
            kernel = tf.einsum("bni,bno->nio", a2, e2)
        return kernel, tf.reduce_sum(e2, axis=0)
    a = tf.broadcast_to(a, tf.concat([[batch, n], tf.shape(a)[2:]], 0))
    per_example = tf.einsum("bnli,bnlo->bnio", a, e)
    return tf.reduce_sum(tf.square(per_example), 0), tf.reduce_sum(
        tf.square(tf.reduce_sum(e, 2)), 0
    )


def batch_normalization_squared_gradients(layer, normalized, e):
    """(first, second) squared-gradient sums of a BatchNormalization particle layer, in its weights' order
    (gamma then beta; beta alone when scale=False)."""
    sums = [
        tf.reduce_sum(tf.square(g), 0)
        for g in scale_shift_gradients(layer, normalized, e)
        if g is not None
    ]
    return sums[0], (sums[1] if len(sums) > 1 else None)


def embedding_squared_gradients(layer, ids, e):
    """(table, None) squared-gradient sums of an Embedding particle layer: the per-example gradient of the
    table is sum over positions of onehot(id) e^T."""
    one_hot, e = embedding_locations(layer, ids, e)
    per_example = tf.einsum("blv,bnld->bnvd", one_hot[:, 0], e)
    return tf.reduce_sum(tf.square(per_example), 0), None


def conv1d_squared_gradients(layer, x, e):
    """(kernel, bias) squared-gradient sums of a Conv1D particle layer (per-example sums over the T' steps;
    e is (B, N, T', F))."""
    patches = conv1d_patches(layer, x)  # (B, N or 1, T', k*C)
    batch, n = tf.shape(e)[0], int(layer.num_particles)
    patches = tf.broadcast_to(patches, tf.concat([[batch, n], tf.shape(patches)[2:]], 0))
    per_example = tf.matmul(patches, e, transpose_a=True)  # (B, N, k*C, F)
    return tf.reduce_sum(tf.square(per_example), 0), tf.reduce_sum(
        tf.square(tf.reduce_sum(e, 2)), 0
    )


def conv2d_squared_gradients(layer, x, e):
    """(kernel, bias) squared-gradient sums of a Conv2D particle layer (per-example sums over locations)."""
    patches = conv_patches(layer, x)  # (B, N or 1, T, kh*kw*C), T = H' W' locations
    batch, n, filters = tf.shape(e)[0], int(layer.num_particles), layer.filters
    locations = tf.reshape(e, (batch, -1, n, filters))  # (B, T, N, F): e's own layout, no transpose
    bias = tf.reduce_sum(tf.square(tf.reduce_sum(locations, 1)), 0)
    if layer.broadcasts:
        # One patch matrix per example serves every particle: (K x T) (T x N F) per example, and the
        # particle axis leaves the product only after the batch sum, when it is small.
        per_example = tf.matmul(
            patches[:, 0], tf.reshape(locations, (batch, -1, n * filters)), transpose_a=True
        )
        kernel = tf.reshape(tf.reduce_sum(tf.square(per_example), 0), (-1, n, filters))  # (K, N, F)
        return tf.transpose(kernel, [1, 0, 2]), bias
    # (B, N, K, F)
    per_example = tf.matmul(patches, tf.transpose(locations, [0, 2, 1, 3]), transpose_a=True)
    return tf.reduce_sum(tf.square(per_example), 0), bias
