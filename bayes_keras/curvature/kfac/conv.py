"""KFAC of Conv1D and Conv2D layers: input patches and output locations, and the factors (their spec
is `dense.dense_spec`)."""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from bayes_keras.curvature.kfac.factors import gradient_factor, input_factor


def conv2d_factors(layer, record, e, scale):
    """{"A", "G"} of a Conv2D particle layer (the H'W' output positions are the locations)."""
    n = int(layer.num_particles)
    return {
        "A": input_factor(conv_patches(layer, record.inputs), layer.bias is not None, n),
        "G": gradient_factor(conv_locations(layer, e), scale),
    }


def conv1d_factors(layer, record, e, scale):
    """{"A", "G"} of a Conv1D particle layer (the T' output steps are the locations; e is (B, N, T', F))."""
    n = int(layer.num_particles)
    return {
        "A": input_factor(conv1d_patches(layer, record.inputs), layer.bias is not None, n),
        "G": gradient_factor(e, scale),
    }


class _Conv1DAsConv2D(NamedTuple):
    """A Conv1D's geometry as a Conv2D of height 1 (what `conv_patches` reads)."""

    kernel_size: tuple
    strides: tuple
    dilation_rate: tuple
    padding: str
    broadcasts: bool
    num_particles: int


def conv1d_patches(layer, x):
    """Input patches of a particle Conv1D whose input is x, (B, N, T, C) (or a first layer's (B, T, C)):
    (B, N or 1, T', k*C) in the kernel's (k, C) order: the sequence as an image of height 1 ('causal' pads
    (k - 1) d steps on the left first, as the layer does)."""
    x = tf.convert_to_tensor(x)
    if layer.padding == "causal":
        pad = (layer.kernel_size - 1) * layer.dilation_rate
        x = tf.pad(x, [[0, 0]] * (len(x.shape) - 2) + [[pad, 0], [0, 0]])
    # (B, 1, T, [N,] C)
    images = tf.expand_dims(x if layer.broadcasts else tf.transpose(x, [0, 2, 1, 3]), 1)
    view = _Conv1DAsConv2D(
        (1, layer.kernel_size),
        (1, layer.strides),
        (1, layer.dilation_rate),
        "valid" if layer.padding == "causal" else layer.padding,
        layer.broadcasts,
        int(layer.num_particles),
    )
    return conv_patches(view, images)


def conv_locations(layer, e):
    """A Conv2D's output-shaped tensor (B, H', W', N, F) -> (B, N, H'W', F): the locations of each particle."""
    e = tf.reshape(e, (tf.shape(e)[0], -1, int(layer.num_particles), layer.filters))
    return tf.transpose(e, [0, 2, 1, 3])


def conv_patches(layer, x):
    """Input patches of a particle Conv2D whose input is x, (B, H, W, N, C) (or a first layer's (B, H, W, C)):
    (B, N or 1, H'W', kh*kw*C) in the kernel's (kh, kw, C) order.

    The same values as tf.image.extract_patches (with the layer's strides, dilation and padding; 'same'
    pads as TF does, the odd pixel at the bottom / right), built by ONE gather of the padded images'
    pixels with a static index table. On small images the cost is per op, not per byte: the gather
    was faster than kh*kw strided slices + concat and than extract_patches on LeNet's 5x5 convolutions
    of 8x8 digits. Falls back to extract_patches when the spatial size is not static."""
    kh, kw = layer.kernel_size
    batch = tf.shape(x)[0]
    if layer.broadcasts:
        images = x
    else:  # (B, H, W, N, C) -> (B*N, H, W, C), each particle's images contiguous
        shape = tf.shape(x)
        images = tf.reshape(
            tf.transpose(x, [0, 3, 1, 2, 4]), tf.stack([-1, shape[1], shape[2], shape[4]])
        )
    height, width, channels = x.shape[1], x.shape[2], x.shape[-1]
    patches = None
    if height is not None and width is not None:
        sizes = []
        for size, k, s, d in (
            (height, kh, layer.strides[0], layer.dilation_rate[0]),
            (width, kw, layer.strides[1], layer.dilation_rate[1]),
        ):
            span = (k - 1) * d + 1
            if layer.padding == "same":
                out = -(-size // s)
                total = max((out - 1) * s + span - size, 0)
                pads = (total // 2, total - total // 2)
            else:
                out, pads = (size - span) // s + 1, (0, 0)
            sizes.append((out, pads, s, d))
        (out_h, pad_h, s_h, d_h), (out_w, pad_w, s_w, d_w) = sizes
        if out_h > 0 and out_w > 0:
            if any(pad_h + pad_w):
                images = tf.pad(images, [[0, 0], list(pad_h), list(pad_w), [0, 0]])
            padded_w = width + sum(pad_w)
            rows = (
                np.arange(out_h)[:, None, None, None] * s_h
                + np.arange(kh)[None, None, :, None] * d_h
            )
            cols = (
                np.arange(out_w)[None, :, None, None] * s_w
                + np.arange(kw)[None, None, None, :] * d_w
            )
            # [location][i][j] -> pixel of the padded image
            index = (rows * padded_w + cols).reshape(-1)
            pixels = tf.reshape(images, tf.stack([-1, (height + sum(pad_h)) * padded_w, channels]))
            patches = tf.reshape(
                tf.gather(pixels, index.astype(np.int32), axis=1),
                tf.stack([-1, out_h * out_w, kh * kw * channels]),
            )
    if patches is None:
        patches = tf.image.extract_patches(
            images,
            sizes=[1, kh, kw, 1],
            strides=[1, *layer.strides, 1],
            rates=[1, *layer.dilation_rate, 1],
            padding=layer.padding.upper(),
        )
    k = patches.shape[-1]
    return tf.reshape(patches, (batch, 1 if layer.broadcasts else layer.num_particles, -1, k))
