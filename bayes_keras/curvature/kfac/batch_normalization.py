"""KFAC of BatchNormalization layers: the diagonal gamma / beta spec, the per-example scale and shift
gradients, and the factors."""

import tensorflow as tf

from bayes_keras.curvature.kfac.blocks import KroneckerBlock, LayerSpec, Piece


def batch_normalization_spec(layer):
    """Kronecker spec of a BatchNormalization particle layer: a diagonal block for gamma and one for beta."""
    return scale_shift_spec([v for v in (layer.gamma, layer.beta) if v is not None], layer)


def scale_shift_gradients(layer, normalized, e):
    """Per-example gradients (g_gamma, g_beta), each (B, N, C) or None when the layer has no such weight, of a
    BatchNormalization particle layer from its normalised input and its output gradient (same layout:
    images (B, H, W, N, C), else (B, N, ..., C)); sums over the locations."""
    n, channels = int(layer.num_particles), int(e.shape[-1])
    batch = tf.shape(e)[0]

    def locations(t):  # -> (B, N, L, C)
        if len(t.shape) == 5:
            return tf.transpose(tf.reshape(t, (batch, -1, n, channels)), [0, 2, 1, 3])
        return tf.reshape(t, (batch, n, -1, channels))

    e = locations(e)
    g_gamma = (
        tf.reduce_sum(e * locations(tf.cast(normalized, e.dtype)), 2)
        if layer.gamma is not None
        else None
    )
    g_beta = tf.reduce_sum(e, 2) if layer.beta is not None else None
    return g_gamma, g_beta


def batch_normalization_factors(layer, record, e, scale):
    """{"A_gamma", "G_gamma", "A_beta", "G_beta"} of a BatchNormalization particle layer (diagonal blocks)."""
    factors = {}
    for role, g in zip(("gamma", "beta"), scale_shift_gradients(layer, record.inputs, e)):
        if g is not None:
            squares = scale * tf.reduce_sum(tf.square(g), 0)  # (N, C)
            factors[f"A_{role}"] = tf.linalg.diag(squares)
            factors[f"G_{role}"] = tf.ones((int(layer.num_particles), 1, 1), squares.dtype)
    return factors


def scale_shift_spec(variables, layer=None):
    """Kronecker spec of BatchNormalization particle variables gamma, beta (N, C): diagonal blocks."""
    dims, views, blocks = {}, [], []
    for variable in variables:
        role = variable.name.split("/")[-1]  # "gamma" or "beta"
        channels = int(variable.shape[1])
        dims.update({f"A_{role}": channels, f"G_{role}": 1})
        views.append((variable, (channels, 1)))
        blocks.append(
            KroneckerBlock(role, f"A_{role}", f"G_{role}", (Piece(variable, 0, channels),))
        )
    return LayerSpec("BatchNormalization", dims, tuple(views), tuple(blocks), layer=layer)
