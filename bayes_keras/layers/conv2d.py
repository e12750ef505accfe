"""2-D convolution with one kernel per particle, as a single grouped convolution."""

import keras
import tensorflow as tf

from bayes_keras.curvature import rules
from bayes_keras.curvature import capture
from bayes_keras.layers.base import ParticleLayer, _default_bias_initializer
from bayes_keras.layers import grouped_convolution
from bayes_keras.layers.grouped_convolution import grouped_conv2d


def _pair(value, name):
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2 or not all(isinstance(v, int) and v > 0 for v in value):
        raise ValueError(f"Conv2D {name} must be an int or a pair of positive ints; got {value!r}.")
    return value


@keras.saving.register_keras_serializable(package="bayes_keras")
class Conv2D(ParticleLayer):
    """2-D convolution whose kernel is an (N, kh, kw, in, out) stack of particles (channels_last).

    The N particles are folded into the channel axis and evaluated as ONE grouped convolution
    (groups = N), so the cost is that of a single wide convolution, not a loop over members. It
    trains on every device: where TensorFlow has no grouped-convolution gradient (CPUs without
    oneDNN) the gradient is computed from forward convolutions (`grouped_convolution.py`).
    Input (batch, N, H, W, C) -> output (batch, N, H', W', filters).

    Args:
        filters, kernel_size, strides, padding, dilation_rate, activation, use_bias,
        kernel_initializer: as in `keras.layers.Conv2D`.
        bias_initializer: default zeros when deterministic, N(0, 0.01^2) per particle otherwise
            (see `bayes_keras.layers.Dense`).
        num_particles, deterministic, kernel_prior, bias_prior: see `ParticleLayer`.

    Example:
        >>> inputs = keras.Input((8, 8, 1))
        >>> h = bayes_keras.layers.Conv2D(6, 5, padding="same", activation="relu", num_particles=10)(inputs)
    """

    curvature_rules = rules.CONV2D  # KFAC and squared-gradient formulas (curvature/rules.py)

    def __init__(
        self,
        filters,
        kernel_size,
        strides=(1, 1),
        padding="valid",
        dilation_rate=(1, 1),
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer=None,
        data_format=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if data_format not in (None, "channels_last"):
            raise ValueError(f"bayes_keras Conv2D supports data_format='channels_last' only; got {data_format!r}.")
        if not isinstance(filters, int) or filters < 1:
            raise ValueError(f"Conv2D filters must be a positive integer; got {filters!r}.")
        padding = str(padding).lower()
        if padding not in ("valid", "same"):
            raise ValueError(f"Conv2D padding must be 'valid' or 'same'; got {padding!r}.")
        self.filters = filters
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.strides = _pair(strides, "strides")
        self.dilation_rate = _pair(dilation_rate, "dilation_rate")
        self.padding = padding
        if max(self.strides) > 1 and max(self.dilation_rate) > 1:
            raise ValueError(f"Conv2D does not support strides > 1 together with dilation_rate > 1 (as in Keras); "
                             f"got strides={self.strides}, dilation_rate={self.dilation_rate}.")
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(_default_bias_initializer(bias_initializer, self.deterministic))

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=4)
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(f"Conv2D '{self.name}' needs a known channel dimension; got {tuple(input_shape)}.")
        kh, kw = self.kernel_size
        fan_in = kh * kw * channels
        self.kernel = self.add_particle_weight("kernel", (kh, kw, channels, self.filters),
                                               self.kernel_initializer, self.kernel_prior, fan_in)
        grouped = not (self.deterministic or self.broadcasts)
        self.supports_jit = grouped_convolution.supports_jit(self.num_particles if grouped else 1)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_particle_weight("bias", (self.filters,), self.bias_initializer,
                                                 self.bias_prior, fan_in)

    def _conv(self, x, kernel):
        """An ungrouped convolution (shared weights, or the first layer's N*F filters); dilated ones
        need the portable gradient on CPUs without oneDNN too."""
        return grouped_conv2d(x, kernel, 1, self.strides, self.padding.upper(), self.dilation_rate)

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs)
        if self.deterministic:
            if self.broadcasts:
                y = self._conv(x, self.kernel)
            else:
                n = self.num_particles
                shape = tf.shape(x)
                y = self._conv(tf.reshape(x, tf.concat([[-1], shape[2:]], 0)), self.kernel)
                y = tf.reshape(y, tf.concat([[shape[0], n], tf.shape(y)[1:]], 0))
            if self.bias is not None:
                y = y + self.bias
            return self.activation(self._broadcast_shared(y))

        n, f = self.num_particles, self.filters
        kh, kw = self.kernel_size
        # (N, kh, kw, C, F) -> (kh, kw, C, N*F): output channel block n belongs to particle n.
        kernel = tf.transpose(self.kernel, [1, 2, 3, 0, 4])
        kernel = tf.reshape(kernel, (kh, kw, -1, n * f))
        if self.broadcasts:
            y = self._conv(x, kernel)  # shared input: an ordinary conv with N*F filters
        else:
            shape = tf.shape(x)
            c = x.shape[-1]
            xg = tf.transpose(x, [0, 2, 3, 1, 4])  # (B, H, W, N, C)
            xg = tf.reshape(xg, tf.stack([shape[0], shape[2], shape[3], n * c]))
            y = grouped_conv2d(xg, kernel, n, self.strides, self.padding.upper(), self.dilation_rate)
        ys = tf.shape(y)
        y = tf.reshape(y, tf.stack([ys[0], ys[1], ys[2], n, f]))
        y = tf.transpose(y, [0, 3, 1, 2, 4])
        if self.bias is not None:
            y = y + tf.reshape(self.bias, (1, n, 1, 1, f))
        capture.record(self, x, y)
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        if self.broadcasts:
            batch, h, w = input_shape[0], input_shape[1], input_shape[2]
            n = self._given_num_particles
        else:
            batch, n, h, w = input_shape[0], input_shape[1], input_shape[2], input_shape[3]

        out = grouped_convolution.output_length
        return (batch, n, out(h, self.kernel_size[0], self.strides[0], self.dilation_rate[0], self.padding),
                out(w, self.kernel_size[1], self.strides[1], self.dilation_rate[1], self.padding), self.filters)

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
