"""2-D convolution with one kernel per particle, as a single grouped convolution."""

import keras
import tensorflow as tf

from bayes_keras.curvature import capture
from bayes_keras.curvature import rules
from bayes_keras.layers.particle_initializers import default_bias_initializer
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.particle_layout import merge_particle_channels, split_particle_channels
from bayes_keras.layers import grouped_convolution
from bayes_keras.layers.grouped_convolution import grouped_conv2d


def positive_pair(value, name):
    """`value` as a pair of positive ints (an int means the same for both spatial axes); a clear error if not."""
    pair = (
        (value, value)
        if isinstance(value, int)
        else tuple(value)
        if isinstance(value, (tuple, list))
        else None
    )
    if (
        pair is None
        or len(pair) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair)
    ):
        raise ValueError(
            f"Conv2D {name} must be a positive int or a pair of positive ints; got {value!r}."
        )
    return pair


@keras.saving.register_keras_serializable(package="bayes_keras")
class Conv2D(ParticleLayer):
    """2-D convolution whose kernel is an (N, kh, kw, in, out) stack of particles (channels_last).

    Image activations carry the particles next to the channels, (batch, H, W, N, C), so the N particles
    are one grouped convolution (groups = N) over the (batch, H, W, N*C) view of the input, with no
    transposes: the cost of a single wide convolution, not a loop over members. It trains on every
    device: where TensorFlow has no grouped-convolution gradient (CPUs without oneDNN) the gradient is
    computed from forward convolutions (`grouped_convolution.py`).
    Input (batch, H, W, N, C) -> output (batch, H', W', N, filters); the first layer (num_particles=N)
    takes (batch, H, W, C).

    Further arguments:

    - filters, kernel_size, strides, padding, dilation_rate, activation, use_bias,
      kernel_initializer, groups: as in `keras.layers.Conv2D` (groups > 1: a grouped convolution per
      particle, without curvature formulas for KFAC / Fisher-based methods).
    - num_particles, deterministic, kernel_prior, bias_prior: see `ParticleLayer`.

    Args:
        bias_initializer: default zeros when deterministic, N(0, 0.01^2) per particle otherwise
            (see `bayes_keras.layers.Dense`).

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
        groups=1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if data_format not in (None, "channels_last"):
            raise ValueError(
                f"bayes_keras Conv2D supports data_format='channels_last' only; got {data_format!r}."
            )
        if isinstance(filters, bool) or not isinstance(filters, int) or filters < 1:
            raise ValueError(f"Conv2D filters must be a positive integer; got {filters!r}.")
        if (
            isinstance(groups, bool)
            or not isinstance(groups, int)
            or groups < 1
            or filters % groups
        ):
            raise ValueError(
                f"Conv2D groups must be a positive integer that divides filters={filters!r}; got "
                f"{groups!r}."
            )
        self.groups = groups
        if groups > 1:
            # KFAC's Kronecker factors assume a dense kernel: no curvature formulas
            self.curvature_rules = None
        padding = str(padding).lower()
        if padding not in ("valid", "same"):
            raise ValueError(f"Conv2D padding must be 'valid' or 'same'; got {padding!r}.")
        self.filters = filters
        self.kernel_size = positive_pair(kernel_size, "kernel_size")
        self.strides = positive_pair(strides, "strides")
        self.dilation_rate = positive_pair(dilation_rate, "dilation_rate")
        self.padding = padding
        if max(self.strides) > 1 and max(self.dilation_rate) > 1:
            raise ValueError(
                f"Conv2D does not support strides > 1 together with dilation_rate > 1 (as in Keras); "
                f"got strides={self.strides}, dilation_rate={self.dilation_rate}."
            )
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(
            default_bias_initializer(bias_initializer, self.deterministic)
        )

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=4)
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                f"Conv2D '{self.name}' needs a known channel dimension; got {tuple(input_shape)}."
            )
        if channels % self.groups:
            raise ValueError(
                f"Conv2D '{self.name}' has groups={self.groups}, which must divide the input's "
                f"{channels} channels."
            )
        kh, kw = self.kernel_size
        channels //= self.groups  # each group sees C / groups input channels
        fan_in = kh * kw * channels
        self.kernel = self.add_particle_weight(
            "kernel",
            (kh, kw, channels, self.filters),
            self.kernel_initializer,
            self.kernel_prior,
            fan_in,
        )
        # every non-first layer is a grouped convolution (a deterministic one with N equal groups)
        self.supports_jit = grouped_convolution.supports_jit(
            1 if self.broadcasts and self.groups == 1 else self.num_particles * self.groups
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_particle_weight(
                "bias", (self.filters,), self.bias_initializer, self.bias_prior, fan_in
            )

    def _conv(self, x, kernel, groups=1):
        return grouped_conv2d(
            x, kernel, groups, self.strides, self.padding.upper(), self.dilation_rate
        )

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs)
        n, f = self.num_particles, self.filters
        kh, kw = self.kernel_size
        g = self.groups
        if self.broadcasts and (g == 1 or self.deterministic):
            grouped = x  # (B, H, W, C), shared by the particles
        elif self.broadcasts:
            # a grouped kernel per particle: every particle's own copy of the input
            grouped = tf.tile(x, [1, 1, 1, n])
        else:
            grouped = merge_particle_channels(x, n)  # (B, H, W, N*C)
        if self.deterministic:
            if self.broadcasts:
                y = self._conv(grouped, self.kernel, groups=g)
            else:  # the shared kernel once per channel block: a grouped convolution with N equal groups (x g)
                y = self._conv(grouped, tf.tile(self.kernel, [1, 1, 1, n]), groups=n * g)
        else:
            # (N, kh, kw, C/g, F) -> (kh, kw, C/g, N*F): output channel block n belongs to particle n (and within
            # it, as in Keras, block i of F/g to group i). A shared input is an ordinary convolution with N*F
            # filters; a particle input a grouped one (groups = N x g).
            kernel = tf.reshape(tf.transpose(self.kernel, [1, 2, 3, 0, 4]), (kh, kw, -1, n * f))
            y = self._conv(grouped, kernel, groups=1 if self.broadcasts and g == 1 else n * g)
        if self.deterministic and self.broadcasts:
            if self.bias is not None:
                y = y + self.bias
            return self.activation(self._broadcast_shared(y))
        if not self.deterministic and not capture.is_capturing():
            # bias and activation on the (B, H', W', N*F) output: a rank-4 add of the flattened (N*F,) biases
            # is one vectorised kernel; the (N, F) broadcast over rank 5 is not (~4% of a LeNet step). An AddV2,
            # not tf.nn.bias_add: without oneDNN Grappler fuses conv + BiasAdd (+ relu) into _FusedConv2D,
            # whose Eigen kernel refuses grouped convolutions.
            if self.bias is not None:
                y = y + tf.reshape(self.bias, (n * f,))
            return split_particle_channels(self.activation(y), n, f)
        y = split_particle_channels(y, n, f)  # (B, H', W', N, F)
        if self.bias is not None:
            y = y + self.bias  # (N, F) or shared (F,): broadcasts over (B, H', W', N, F)
        if not self.deterministic and g == 1:
            capture.record(self, x, y)
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        batch, h, w = input_shape[0], input_shape[1], input_shape[2]
        n = self._given_num_particles if self.broadcasts else input_shape[3]
        out = grouped_convolution.output_length
        return (
            batch,
            out(h, self.kernel_size[0], self.strides[0], self.dilation_rate[0], self.padding),
            out(w, self.kernel_size[1], self.strides[1], self.dilation_rate[1], self.padding),
            n,
            self.filters,
        )

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
                "groups": self.groups,
            }
        )
        return config
