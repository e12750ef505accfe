"""1-D convolution with one kernel per particle, as a single grouped convolution."""

import keras
import tensorflow as tf

from bayes_keras.curvature import capture, rules
from bayes_keras.layers import grouped_convolution
from bayes_keras.layers.particle_initializers import default_bias_initializer
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.grouped_convolution import grouped_conv2d


def _single(value, name):
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Conv1D {name} must be a positive int (or a 1-tuple); got {value!r}.")
    return value


@keras.saving.register_keras_serializable(package="bayes_keras")
class Conv1D(ParticleLayer):
    """1-D convolution whose kernel is an (N, k, in, out) stack of particles (channels_last).

    The counterpart of `keras.layers.Conv1D`: each particle's slice equals a Keras Conv1D with those
    weights. The sequence is run as a 1 x T image through the same grouped convolution as
    `bayes_keras.layers.Conv2D` (particles folded into the channels, groups = N; gradients on every
    device). Input (batch, N, T, C) -> output (batch, N, T', filters); the first Bayesian layer
    (`num_particles=N`) takes an ordinary (batch, T, C) input.

    Further arguments:

    - filters, kernel_size, strides, padding ("valid" | "same" | "causal"), dilation_rate,
      activation, use_bias, kernel_initializer: as in `keras.layers.Conv1D`.
    - num_particles, deterministic, kernel_prior, bias_prior: see `ParticleLayer`.

    Args:
        bias_initializer: default zeros when deterministic, N(0, 0.01^2) per particle otherwise.

    Example:
        >>> inputs = keras.Input((8, 8))                       # 8 steps of 8 features
        >>> h = bayes_keras.layers.Conv1D(16, 3, padding="causal", activation="relu", num_particles=10)(inputs)
    """

    curvature_rules = rules.CONV1D  # KFAC and squared-gradient formulas (curvature/rules.py)

    def __init__(
        self,
        filters,
        kernel_size,
        strides=1,
        padding="valid",
        dilation_rate=1,
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer=None,
        data_format=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if data_format not in (None, "channels_last"):
            raise ValueError(
                f"bayes_keras Conv1D supports data_format='channels_last' only; got {data_format!r}."
            )
        if isinstance(filters, bool) or not isinstance(filters, int) or filters < 1:
            raise ValueError(f"Conv1D filters must be a positive integer; got {filters!r}.")
        padding = str(padding).lower()
        if padding not in ("valid", "same", "causal"):
            raise ValueError(
                f"Conv1D padding must be 'valid', 'same' or 'causal'; got {padding!r}."
            )
        self.filters = filters
        self.kernel_size = _single(kernel_size, "kernel_size")
        self.strides = _single(strides, "strides")
        self.dilation_rate = _single(dilation_rate, "dilation_rate")
        if self.strides > 1 and self.dilation_rate > 1:
            raise ValueError(
                f"Conv1D does not support strides > 1 together with dilation_rate > 1 (as in Keras); "
                f"got strides={self.strides}, dilation_rate={self.dilation_rate}."
            )
        self.padding = padding
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(
            default_bias_initializer(bias_initializer, self.deterministic)
        )

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=3)
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                f"Conv1D '{self.name}' needs a known channel dimension; got {tuple(input_shape)}."
            )
        fan_in = self.kernel_size * channels
        self.kernel = self.add_particle_weight(
            "kernel",
            (self.kernel_size, channels, self.filters),
            self.kernel_initializer,
            self.kernel_prior,
            fan_in,
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_particle_weight(
                "bias", (self.filters,), self.bias_initializer, self.bias_prior, fan_in
            )
        grouped = not (self.deterministic or self.broadcasts)
        self.supports_jit = grouped_convolution.supports_jit(self.num_particles if grouped else 1)

    def _as_image(self, x):
        """(..., T, C) -> (..., 1, T, C), left-padded for 'causal'."""
        if self.padding == "causal":
            pad = (self.kernel_size - 1) * self.dilation_rate
            x = tf.pad(x, [[0, 0]] * (len(x.shape) - 2) + [[pad, 0], [0, 0]])
        return tf.expand_dims(x, -3)

    def _padding(self):
        return "VALID" if self.padding == "causal" else self.padding.upper()

    def call(self, inputs):
        x = self._as_image(tf.convert_to_tensor(inputs))  # (B, [N,] 1, T, C)
        strides, dilations = (1, self.strides), (1, self.dilation_rate)
        n, f = self.num_particles, self.filters
        if self.deterministic:
            kernel = self.kernel[None]  # (1, k, C, F)
            images = x if self.broadcasts else tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0))
            y = grouped_conv2d(images, kernel, 1, strides, self._padding(), dilations)[:, 0]
            if not self.broadcasts:
                y = tf.reshape(y, tf.concat([tf.shape(x)[:2], tf.shape(y)[1:]], 0))
            if self.bias is not None:
                y = y + self.bias
            return self.activation(self._broadcast_shared(y))
        # (N, k, C, F) -> (1, k, C, N*F): output channel block n belongs to particle n.
        kernel = tf.reshape(
            tf.transpose(self.kernel, [1, 2, 0, 3]), (1, self.kernel_size, -1, n * f)
        )
        if self.broadcasts:
            y = grouped_conv2d(x, kernel, 1, strides, self._padding(), dilations)
        else:
            shape = tf.shape(x)  # (B, N, 1, T, C)
            xg = tf.transpose(x, [0, 2, 3, 1, 4])
            xg = tf.reshape(xg, tf.stack([shape[0], 1, shape[3], n * x.shape[-1]]))
            y = grouped_conv2d(xg, kernel, n, strides, self._padding(), dilations)
        capturing = capture.is_capturing()
        # bias and activation before the transpose, on (B, 1, T', N*F) (see Conv2D)
        if not capturing:
            if self.bias is not None:
                y = y + tf.reshape(self.bias, (n * f,))
            y = self.activation(y)
        ys = tf.shape(y)  # (B, 1, T', N*F)
        y = tf.transpose(tf.reshape(y, tf.stack([ys[0], ys[2], n, f])), [0, 2, 1, 3])
        if not capturing:
            return y
        if self.bias is not None:
            y = y + tf.reshape(self.bias, (1, n, 1, f))
        capture.record(self, inputs, y)
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        if self.broadcasts:
            batch, steps, n = input_shape[0], input_shape[1], self._given_num_particles
        else:
            batch, n, steps = input_shape[0], input_shape[1], input_shape[2]
        # 'causal' pads (k - 1) d steps on the left: the length of 'same'
        padding = "same" if self.padding == "causal" else self.padding
        steps = grouped_convolution.output_length(
            steps, self.kernel_size, self.strides, self.dilation_rate, padding
        )
        return (batch, n, steps, self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "kernel_size": self.kernel_size,
                "strides": self.strides,
                "padding": self.padding,
                "dilation_rate": self.dilation_rate,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
