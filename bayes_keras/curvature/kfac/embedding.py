"""KFAC of Embedding layers: the table's spec, token positions as locations, and the factors."""

import tensorflow as tf

from bayes_keras.curvature.kfac.factors import gradient_factor, input_factor
from bayes_keras.curvature.kfac.blocks import KroneckerBlock, LayerSpec, Piece


def embedding_spec(layer):
    """Kronecker spec of an Embedding particle layer: one block, the (V, D) table."""
    return embedding_table_spec(layer.embeddings, layer)


def embedding_locations(layer, ids, e):
    """An Embedding's token ids and output gradient as locations: (one-hot ids (B, 1, L, V), e (B, N, L, D))."""
    batch = tf.shape(e)[0]
    one_hot = tf.one_hot(
        tf.reshape(tf.cast(ids, tf.int32), (batch, 1, -1)), layer.input_dim, dtype=e.dtype
    )
    return one_hot, tf.reshape(e, (batch, int(layer.num_particles), -1, layer.output_dim))


def embedding_factors(layer, record, e, scale):
    """{"A", "G"} of an Embedding particle layer (every token position is a location)."""
    one_hot, e = embedding_locations(layer, record.inputs, e)
    return {
        "A": input_factor(one_hot, False, int(layer.num_particles)),
        "G": gradient_factor(e, scale),
    }


def embedding_table_spec(table, layer=None):
    """Kronecker spec of an Embedding's particle table (N, V, D): one block, the (V, D) table."""
    rows, out = int(table.shape[1]), int(table.shape[2])
    return LayerSpec(
        "Embedding",
        {"A": rows, "G": out},
        ((table, (rows, out)),),
        (KroneckerBlock("weights", "A", "G", (Piece(table, 0, rows),)),),
        layer=layer,
    )
