"""ConcatSquashDense: a dense layer whose output is gated and shifted by the flow time t."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bayes_keras")
class ConcatSquashDense(keras.layers.Layer):
    """y = (W h + b) * sigmoid(w_g t + b_g) + w_b t: a time-conditioned dense layer.

    The time-dependent layer of FFJORD (Grathwohl et al. 2019, https://arxiv.org/abs/1810.01367) that
    the Particle Flow Bayes' Rule velocity uses for its body. Called as `layer([h, t])` with h of shape
    (..., features) and t a scalar (or broadcastable to h's leading axes plus one).

    Example:

        layer = ConcatSquashDense(64)
        y = layer([keras.ops.ones((5, 3)), keras.ops.convert_to_tensor(0.5)])   # (5, 64)
    """

    def __init__(self, units, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if int(units) < 1:
            raise ValueError(f"ConcatSquashDense: units must be a positive integer; got {units!r}.")
        self.units = int(units)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        features = int(input_shape[0][-1])
        self.kernel = self.add_weight(
            name="kernel", shape=(features, self.units), initializer=self.kernel_initializer
        )
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")
        self.gate_kernel = self.add_weight(
            name="gate_kernel", shape=(self.units,), initializer="glorot_uniform"
        )
        self.gate_bias = self.add_weight(name="gate_bias", shape=(self.units,), initializer="zeros")
        self.time_bias = self.add_weight(name="time_bias", shape=(self.units,), initializer="zeros")

    def call(self, inputs):
        h, t = inputs
        t = ops.cast(t, h.dtype)
        gate = ops.sigmoid(self.gate_kernel * t + self.gate_bias)
        return (ops.matmul(h, self.kernel) + self.bias) * gate + self.time_bias * t

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0][:-1]) + (self.units,)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }
