"""Depthwise 2-D convolution with one depthwise kernel per particle, as a single depthwise convolution."""

import keras
import tensorflow as tf

from bayes_keras.layers.particle_initializers import default_bias_initializer
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.particle_layout import merge_particle_channels, split_particle_channels
from bayes_keras.layers import grouped_convolution
from bayes_keras.layers.conv2d import positive_pair


def particle_depthwise_conv2d(layer, x, kernel):
    """`layer`'s depthwise convolution of particle images: x (B, H, W, N, C), or (B, H, W, C) shared by the particles
    when `layer` starts the particle axis, with kernel (N, kh, kw, C, M) (or (kh, kw, C, M) when deterministic)
    -> (B, H', W', N*C*M), channel block n of particle n in Keras' order (c * M + m).

    Every particle's C channels are C more channels of ONE tf.nn.depthwise_conv2d on the (B, H, W, N*C) view
    (a depthwise convolution never mixes channels, so it never mixes particles), which has native gradients on
    every device."""
    n = layer.num_particles
    kh, kw = layer.kernel_size
    grouped = tf.tile(x, [1, 1, 1, n]) if layer.broadcasts else merge_particle_channels(x, n)
    if layer.deterministic:
        # (kh, kw, N*C, M): the shared kernel for every channel block
        kernel = tf.tile(kernel, [1, 1, n, 1])
    else:
        kernel = tf.reshape(tf.transpose(kernel, [1, 2, 0, 3, 4]), (kh, kw, -1, kernel.shape[-1]))
    sh, sw = layer.strides
    return tf.nn.depthwise_conv2d(
        grouped, kernel, (1, sh, sw, 1), layer.padding.upper(), dilations=layer.dilation_rate
    )


def particle_image_output_shape(layer, input_shape, channels):
    """(B, H', W', N, channels) of a particle image layer with `layer`'s kernel_size, strides, dilation_rate and
    padding, on (B, H, W, N, C) (or (B, H, W, C) where `layer` starts the particle axis)."""
    n = layer._given_num_particles if layer.broadcasts else input_shape[3]
    out = grouped_convolution.output_length
    return (
        input_shape[0],
        out(
            input_shape[1],
            layer.kernel_size[0],
            layer.strides[0],
            layer.dilation_rate[0],
            layer.padding,
        ),
        out(
            input_shape[2],
            layer.kernel_size[1],
            layer.strides[1],
            layer.dilation_rate[1],
            layer.padding,
        ),
        n,
        channels,
    )


def set_depthwise_geometry(
    layer, kernel_size, strides, padding, depth_multiplier, data_format, dilation_rate
):
    """Validates and sets `layer`'s kernel_size, strides, padding, depth_multiplier and dilation_rate as Keras'
    DepthwiseConv2D and SeparableConv2D accept them (channels_last only)."""
    name = type(layer).__name__
    if data_format not in (None, "channels_last"):
        raise ValueError(
            f"bayes_keras {name} supports data_format='channels_last' only; got {data_format!r}."
        )
    if (
        isinstance(depth_multiplier, bool)
        or not isinstance(depth_multiplier, int)
        or depth_multiplier < 1
    ):
        raise ValueError(
            f"{name} depth_multiplier must be a positive integer; got {depth_multiplier!r}."
        )
    padding = str(padding).lower()
    if padding not in ("valid", "same"):
        raise ValueError(f"{name} padding must be 'valid' or 'same'; got {padding!r}.")
    layer.kernel_size = positive_pair(kernel_size, "kernel_size")
    layer.strides = positive_pair(strides, "strides")
    layer.dilation_rate = positive_pair(dilation_rate, "dilation_rate")
    if max(layer.strides) > 1 and max(layer.dilation_rate) > 1:
        raise ValueError(
            f"{name} does not support strides > 1 together with dilation_rate > 1 (as in Keras); "
            f"got strides={layer.strides}, dilation_rate={layer.dilation_rate}."
        )
    layer.padding, layer.depth_multiplier = padding, depth_multiplier


def add_depthwise_kernel(layer, input_shape):
    """Sets `layer.channels` (the known channel dimension of `input_shape`) and creates `layer.depthwise_kernel`,
    (N, kh, kw, C, depth_multiplier), fan-in kh * kw; `layer`'s particles are resolved already."""
    if input_shape[-1] is None:
        raise ValueError(
            f"{type(layer).__name__} '{layer.name}' needs a known channel dimension; got "
            f"{tuple(input_shape)}."
        )
    layer.channels = int(input_shape[-1])
    kh, kw = layer.kernel_size
    layer.depthwise_kernel = layer.add_particle_weight(
        "depthwise_kernel",
        (kh, kw, layer.channels, layer.depth_multiplier),
        layer.depthwise_initializer,
        layer.kernel_prior,
        kh * kw,
    )


@keras.saving.register_keras_serializable(package="bayes_keras")
class DepthwiseConv2D(ParticleLayer):
    """Depthwise 2-D convolution whose depthwise kernel is an (N, kh, kw, C, depth_multiplier) stack of particles
    (channels_last), as `keras.layers.DepthwiseConv2D` per particle.

    The N particles' C channels are the N*C channels of one depthwise convolution over the (batch, H, W, N*C)
    view of the particle images (batch, H, W, N, C): the cost of one wide depthwise convolution, with native
    gradients on every device. Output (batch, H', W', N, C * depth_multiplier); the first particle layer
    (num_particles=N) takes (batch, H, W, C).

    Further arguments:

    - kernel_size, strides, padding, depth_multiplier, dilation_rate, activation, use_bias,
      depthwise_initializer: as in `keras.layers.DepthwiseConv2D`.
    - num_particles, deterministic, kernel_prior (the depthwise kernel's), bias_prior: see `ParticleLayer`.
      The prior's fan-in is kh * kw (each output channel sees one input channel).

    Args:
        bias_initializer: default zeros when deterministic, N(0, 0.01^2) per particle otherwise.

    Example:
        >>> h = bayes_keras.layers.Conv2D(16, 3, padding="same", num_particles=8)(inputs)   # (batch, H, W, 8, 16)
        >>> h = bayes_keras.layers.DepthwiseConv2D(3, padding="same", activation="relu")(h)
    """

    def __init__(
        self,
        kernel_size,
        strides=(1, 1),
        padding="valid",
        depth_multiplier=1,
        data_format=None,
        dilation_rate=(1, 1),
        activation=None,
        use_bias=True,
        depthwise_initializer="glorot_uniform",
        bias_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        set_depthwise_geometry(
            self, kernel_size, strides, padding, depth_multiplier, data_format, dilation_rate
        )
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.depthwise_initializer = keras.initializers.get(depthwise_initializer)
        self.bias_initializer = keras.initializers.get(
            default_bias_initializer(bias_initializer, self.deterministic)
        )

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=4)
        add_depthwise_kernel(self, input_shape)
        kh, kw = self.kernel_size
        self.bias = None
        if self.use_bias:
            self.bias = self.add_particle_weight(
                "bias",
                (self.channels * self.depth_multiplier,),
                self.bias_initializer,
                self.bias_prior,
                kh * kw,
            )

    def call(self, inputs):
        y = particle_depthwise_conv2d(self, tf.convert_to_tensor(inputs), self.depthwise_kernel)
        y = split_particle_channels(y, self.num_particles, self.channels * self.depth_multiplier)
        if self.bias is not None:
            y = y + self.bias  # (N, C*M) or shared (C*M,): broadcasts over (B, H', W', N, C*M)
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        return particle_image_output_shape(
            self, input_shape, input_shape[-1] * self.depth_multiplier
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "kernel_size": self.kernel_size,
                "strides": self.strides,
                "padding": self.padding,
                "depth_multiplier": self.depth_multiplier,
                "dilation_rate": self.dilation_rate,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "depthwise_initializer": keras.initializers.serialize(self.depthwise_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
