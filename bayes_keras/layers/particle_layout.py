"""The layout of particle activations.

Inside a model an activation is (batch, particles, ...), except image activations (rank 5), which are
(batch, H, W, particles, channels): particles next to the channels, so that a particle convolution is one
grouped convolution and batch normalization one fused op, with no transposes between layers
(`particle_axis`; docs/architecture.md, "Particle axis").
"""

import tensorflow as tf


IMAGE_RANK = 5  # (batch, H, W, particles, channels)


def particle_axis(rank):
    """The particle axis of a particle activation of `rank`: 3 for images (batch, H, W, N, C), else 1
    ((batch, N, features), (batch, N, time, features))."""
    return IMAGE_RANK - 2 if rank == IMAGE_RANK else 1


def merge_particle_channels(x, num_particles):
    """Particle images (B, H, W, N, C) -> their (B, H, W, N*C) view (channel block n is particle n): a reshape,
    no copy. The view particle convolutions, pooling and batch normalization run on."""
    if all_known(x.shape[1:3]):  # a static target shape: one op in eager code, not five
        return tf.reshape(x, (-1, x.shape[1], x.shape[2], num_particles * x.shape[-1]))
    shape = tf.shape(x)
    return tf.reshape(x, tf.stack([shape[0], shape[1], shape[2], num_particles * x.shape[-1]]))


def split_particle_channels(y, num_particles, channels):
    """Inverse of `merge_particle_channels`: (B, H, W, N*C) -> (B, H, W, N, C), a reshape, no copy."""
    if all_known(y.shape[1:3]):
        return tf.reshape(y, (-1, y.shape[1], y.shape[2], num_particles, channels))
    shape = tf.shape(y)
    return tf.reshape(y, tf.stack([shape[0], shape[1], shape[2], num_particles, channels]))


def all_known(dims):
    """Whether every dimension is known and nonzero (so that a -1 batch dimension is determined)."""
    return all(d is not None and d > 0 for d in dims)


def per_particle_shape(rank, num_particles, channels):
    """Shape that broadcasts an (N, C) parameter against a particle activation of `rank`."""
    shape = [1] * rank
    shape[particle_axis(rank)], shape[-1] = num_particles, channels
    return shape
