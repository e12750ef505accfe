"""Long short-term memory layer with one weight set per particle (see `_recurrent` for the layout)."""

import keras
import tensorflow as tf

from bayes_keras.curvature import rules
from bayes_keras.layers._recurrent import _ParticleRNN, _ShiftedInitializer


@keras.saving.register_keras_serializable(package="bayes_keras")
class LSTM(_ParticleRNN):
    """`keras.layers.LSTM` with an (N, ...) stack of weight sets, gates in Keras' order (i, f, c, o).

    z_t = x_t W + h_{t-1} U + b; i, f, o = recurrent_activation(z_i, z_f, z_o);
    c_t = f * c_{t-1} + i * activation(z_c); h_t = o * activation(c_t).

    Input (batch, T, F) on the layer that starts the particle axis, else (batch, N, T, F); output
    (batch, N, units), or (batch, N, T, units) with `return_sequences=True`. Weights: kernel
    (N, F, 4*units), recurrent_kernel (N, units, 4*units), bias (N, 4*units); no N axis when
    deterministic.

    Further arguments:

    - units, activation, recurrent_activation, use_bias, kernel_initializer,
      recurrent_initializer, return_sequences, go_backwards, unroll: as in `keras.layers.LSTM`.
    - num_particles, deterministic, kernel_prior, bias_prior: see `ParticleLayer`.
    - dropout, recurrent_dropout, seed: as in Keras, with one mask per sequence and particle (the same
      at every step, one for all gates): variational RNN dropout, in training only.

    Keras' stateful, return_state, regularizers and constraints are not implemented: non-default
    values raise ValueError. Masks (e.g. from Embedding(mask_zero=True)) are respected.

    Args:
        bias_initializer: default zeros when deterministic, N(0, 0.01^2) per particle otherwise.
        unit_forget_bias: add 1 to the forget-gate block of the initial bias. Keras sets that block
            to exactly 1; with the default initialisers this is the same for a deterministic layer
            (zeros + 1), and 1 + N(0, 0.01^2) per particle otherwise (so the particles are not
            identical on those coordinates, see `bayes_keras.layers.Dense`).

    Other Parameters:
        recurrent_prior: prior of the recurrent kernel (default: the kernel prior).

    Example:
        >>> inputs = keras.Input((8, 8))
        >>> h = bayes_keras.layers.LSTM(32, return_sequences=True, num_particles=10)(inputs)
        >>> h = bayes_keras.layers.LSTM(32)(h)                 # (batch, 10, 32)
    """

    curvature_rules = rules.LSTM  # KFAC and squared-gradient formulas (curvature/rules.py)

    _gates = 4

    def __init__(
        self,
        units,
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias=True,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer=None,
        unit_forget_bias=True,
        **kwargs,
    ):
        super().__init__(
            units,
            activation=activation,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            recurrent_initializer=recurrent_initializer,
            bias_initializer=bias_initializer,
            **kwargs,
        )
        self.recurrent_activation = keras.activations.get(recurrent_activation)
        self.unit_forget_bias = bool(unit_forget_bias)

    def _bias_initializer_for_build(self):
        if not self.unit_forget_bias:
            return self.bias_initializer
        return _ShiftedInitializer(
            self.bias_initializer, start=self.units, size=self.units, shift=1.0
        )

    def _initial_states(self, h0):
        return (h0, tf.zeros_like(h0))

    def _step(self, states, xw_t, recurrent_kernel, recurrent_bias, recurrent_keep=None):
        h, c = states
        z = xw_t + self._recurrent_matmul(self._dropped(h, recurrent_keep), recurrent_kernel)
        z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
        i = self.recurrent_activation(z_i)
        f = self.recurrent_activation(z_f)
        c = f * c + i * self.activation(z_c)
        o = self.recurrent_activation(z_o)
        return (o * self.activation(c), c)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "recurrent_activation": keras.activations.serialize(self.recurrent_activation),
                "unit_forget_bias": self.unit_forget_bias,
            }
        )
        return config
