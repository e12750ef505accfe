"""Random layers that draw under tf.distribute what one device draws (docs/distributed.md, "Random layers").

On one device a random layer draws for its input's shape from its seed generator. Under data parallelism each
replica holds some rows of the global batch and, under particle parallelism, some of the particles; a layer that
drew for its own shape would give rows b and b + B/2 (or particles n and n + N/2) the same noise, because every
replica's seed generator holds the same state. These layers draw for the global batch and every particle, with
the generator's state one device would use, and keep this replica's part (bayes_keras.distribute.global_draw)."""

import tensorflow as tf

from bayes_keras.training import distribute
from bayes_keras.layers.particle_layout import particle_axis


def draw_as_one_device(layer, x, draw, noise_shape=None):
    """This replica's part of `draw(shape)` made for the global shape of `x` (or of `noise_shape`, whose None
    entries take x's sizes). `layer.receives_particles`: whether x carries the particle axis (axis 1, or 3 for
    images (batch, H, W, N, C); set by BayesianModel from the model's graph: a layer before the first particle
    layer has none)."""
    axis = particle_axis(len(x.shape)) if layer.receives_particles and len(x.shape) > 1 else None
    # the particle axis from the running tensor: under particle parallelism a replica has fewer particles than the
    # model's static shape says
    dims = [tf.shape(x)[i] if d is None or i == axis else d for i, d in enumerate(x.shape)]
    if noise_shape is not None:
        dims = [d if n is None else n for d, n in zip(dims, noise_shape)]
        axis = None if axis is None or noise_shape[axis] == 1 else axis
    rows = noise_shape is None or noise_shape[0] != 1
    return distribute.global_draw(layer, draw, dims, particle_axis=axis, rows=rows)
