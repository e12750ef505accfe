"""Axis permutations of small weight tensors, written as einsums."""

import tensorflow as tf

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def permute(x, perm):
    """tf.transpose(x, perm) as a tf.einsum (x of static rank).

    With oneDNN on, TensorFlow runs a Transpose op through oneDNN, which has a large fixed cost on small
    tensors; the Einsum kernel transposes with Eigen (docs/architecture.md, "Particle axis"). For
    kernels a layer rearranges every step, not for activations between layers: Grappler removes a
    Transpose followed by its inverse, and not an einsum."""
    letters = _LETTERS[: len(perm)]
    return tf.einsum(f"{letters}->{''.join(letters[p] for p in perm)}", x)
