"""Depthwise-separable 2-D convolution with one depthwise and one pointwise kernel per particle."""

import keras
import tensorflow as tf

from bayes_keras.layers.particle_initializers import default_bias_initializer
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.particle_layout import split_particle_channels
from bayes_keras.layers import grouped_convolution
from bayes_keras.layers.depthwise_conv2d import (
    add_depthwise_kernel,
    particle_depthwise_conv2d,
    particle_image_output_shape,
    set_depthwise_geometry,
)
from bayes_keras.layers.grouped_convolution import grouped_conv2d


@keras.saving.register_keras_serializable(package="bayes_keras")
class SeparableConv2D(ParticleLayer):
    """Depthwise-separable 2-D convolution per particle, as `keras.layers.SeparableConv2D`: a depthwise
    convolution (kernel (N, kh, kw, C, depth_multiplier)) followed by a pointwise 1x1 convolution (kernel
    (N, 1, 1, C * depth_multiplier, filters)), one stack of both per particle.

    The depthwise step is one depthwise convolution of the (batch, H, W, N*C) view (see `DepthwiseConv2D`), the
    pointwise step one grouped 1x1 convolution with groups = N (see `Conv2D`). Output (batch, H', W', N, filters).

    Further arguments:

    - filters, kernel_size, strides, padding, depth_multiplier, dilation_rate, activation, use_bias,
      depthwise_initializer, pointwise_initializer: as in `keras.layers.SeparableConv2D`.
    - num_particles, deterministic, kernel_prior (both kernels'), bias_prior: see `ParticleLayer`. Fan-ins:
      kh * kw for the depthwise kernel, C * depth_multiplier for the pointwise kernel and the bias.

    Args:
        bias_initializer: default zeros when deterministic, N(0, 0.01^2) per particle otherwise.

    Example:
        >>> h = bayes_keras.layers.SeparableConv2D(32, 3, padding="same", activation="relu")(h)
    """

    def __init__(
        self,
        filters,
        kernel_size,
        strides=(1, 1),
        padding="valid",
        depth_multiplier=1,
        data_format=None,
        dilation_rate=(1, 1),
        activation=None,
        use_bias=True,
        depthwise_initializer="glorot_uniform",
        pointwise_initializer="glorot_uniform",
        bias_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(filters, bool) or not isinstance(filters, int) or filters < 1:
            raise ValueError(
                f"SeparableConv2D filters must be a positive integer; got {filters!r}."
            )
        set_depthwise_geometry(
            self, kernel_size, strides, padding, depth_multiplier, data_format, dilation_rate
        )
        self.filters = filters
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.depthwise_initializer = keras.initializers.get(depthwise_initializer)
        self.pointwise_initializer = keras.initializers.get(pointwise_initializer)
        self.bias_initializer = keras.initializers.get(
            default_bias_initializer(bias_initializer, self.deterministic)
        )

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=4)
        add_depthwise_kernel(self, input_shape)
        depth = self.channels * self.depth_multiplier
        self.pointwise_kernel = self.add_particle_weight(
            "pointwise_kernel",
            (1, 1, depth, self.filters),
            self.pointwise_initializer,
            self.kernel_prior,
            depth,
        )
        self.supports_jit = grouped_convolution.supports_jit(self.num_particles)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_particle_weight(
                "bias", (self.filters,), self.bias_initializer, self.bias_prior, depth
            )

    def call(self, inputs):
        n, f = self.num_particles, self.filters
        depthwise = particle_depthwise_conv2d(
            self, tf.convert_to_tensor(inputs), self.depthwise_kernel
        )
        if self.deterministic:
            pointwise = tf.tile(self.pointwise_kernel, [1, 1, 1, n])
        else:
            pointwise = tf.reshape(
                tf.transpose(self.pointwise_kernel, [1, 2, 3, 0, 4]), (1, 1, -1, n * f)
            )
        y = grouped_conv2d(depthwise, pointwise, n, (1, 1), "VALID", (1, 1))  # (B, H', W', N*F)
        y = split_particle_channels(y, n, f)
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        return particle_image_output_shape(self, input_shape, self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "kernel_size": self.kernel_size,
                "strides": self.strides,
                "padding": self.padding,
                "depth_multiplier": self.depth_multiplier,
                "dilation_rate": self.dilation_rate,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "depthwise_initializer": keras.initializers.serialize(self.depthwise_initializer),
                "pointwise_initializer": keras.initializers.serialize(self.pointwise_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
