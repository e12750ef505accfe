"""KFAC of Dense layers: the [kernel; bias] spec (also Conv1D's and Conv2D's) and the factors."""

import tensorflow as tf

from bayes_keras.curvature.kfac.factors import gradient_factor, input_factor
from bayes_keras.curvature.kfac.specs import spec
from bayes_keras.curvature.kinds import layer_kind


def dense_spec(layer):
    """Kronecker spec of a Dense, Conv1D or Conv2D particle layer: one block [kernel; bias]."""
    return spec(layer_kind(layer), layer.kernel, getattr(layer, "bias", None), layer=layer)


def dense_factors(layer, record, e, scale):
    """{"A", "G"} of a Dense particle layer (L locations for inputs (batch, [N,] ..., in))."""
    n, batch = int(layer.num_particles), tf.shape(e)[0]
    in_dim = int(layer.kernel.shape[1])
    a = tf.reshape(record.inputs, (batch, 1 if layer.broadcasts else n, -1, in_dim))
    e = tf.reshape(e, (batch, n, -1, layer.units))
    return {"A": input_factor(a, layer.bias is not None, n), "G": gradient_factor(e, scale)}
