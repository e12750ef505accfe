"""Gated recurrent unit layer with one weight set per particle (see `_recurrent` for the layout)."""

import keras
import tensorflow as tf

from bayes_keras.curvature import rules
from bayes_keras.layers._recurrent import _ParticleRNN


@keras.saving.register_keras_serializable(package="bayes_keras")
class GRU(_ParticleRNN):
    """`keras.layers.GRU` with an (N, ...) stack of weight sets, gates in Keras' order (z, r, h).

    reset_after=True (Keras' default, the cuDNN form): with x-part a_t = x_t W + b_in and
    recurrent part g_t = h_{t-1} U + b_rec, z = sigma(a_z + g_z), r = sigma(a_r + g_r),
    hh = act(a_h + r * g_h). reset_after=False: g uses h_{t-1} U for z and r, and the candidate is
    hh = act(a_h + (r * h_{t-1}) U_h). Then h_t = z * h_{t-1} + (1 - z) * hh.

    Input (batch, T, F) on the layer that starts the particle axis, else (batch, N, T, F); output
    (batch, N, units), or (batch, N, T, units) with `return_sequences=True`. Weights: kernel
    (N, F, 3*units), recurrent_kernel (N, units, 3*units), bias (N, 2, 3*units) with reset_after
    (row 0 input bias, row 1 recurrent bias, as Keras) or (N, 3*units); no N axis when deterministic.

    Further arguments:

    - units, activation, recurrent_activation, use_bias, kernel_initializer,
      recurrent_initializer, return_sequences, go_backwards, unroll, reset_after: as in
      `keras.layers.GRU`.
    - num_particles, deterministic, kernel_prior, bias_prior: see `ParticleLayer`.
    - dropout, recurrent_dropout, seed: as in Keras, with one mask per sequence and particle (the same
      at every step, one for all gates): variational RNN dropout, in training only.

    Keras' stateful, return_state, regularizers and constraints are not implemented: non-default
    values raise ValueError. Masks (e.g. from Embedding(mask_zero=True)) are respected.

    Args:
        bias_initializer: default zeros when deterministic, N(0, 0.01^2) per particle otherwise.

    Other Parameters:
        recurrent_prior: prior of the recurrent kernel (default: the kernel prior).

    Example:
        >>> inputs = keras.Input((8, 8))                       # digits: 8 rows of 8 pixels
        >>> h = bayes_keras.layers.GRU(32, num_particles=10)(inputs)      # (batch, 10, 32)
        >>> logits = bayes_keras.layers.Dense(10)(h)
    """

    curvature_rules = rules.GRU  # KFAC and squared-gradient formulas (curvature/rules.py)

    _gates = 3

    def __init__(
        self,
        units,
        activation="tanh",
        recurrent_activation="sigmoid",
        use_bias=True,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer=None,
        *,
        reset_after=True,
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
        self.reset_after = bool(reset_after)

    def _bias_shape(self):
        return (2, 3 * self.units) if self.reset_after else (3 * self.units,)

    def _split_bias(self, bias):
        if not self.reset_after:
            return bias, None
        return bias[..., 0, :], bias[..., 1, :]

    def _step(self, states, xw_t, recurrent_kernel, recurrent_bias, recurrent_keep=None):
        h = states[0]
        h_in = self._dropped(h, recurrent_keep)  # what enters the recurrent matmuls
        u = self.units
        a_z, a_r, a_h = tf.split(xw_t, 3, axis=-1)
        if self.reset_after:
            g = self._recurrent_matmul(h_in, recurrent_kernel)
            if recurrent_bias is not None:
                g = g + recurrent_bias
            g_z, g_r, g_h = tf.split(g, 3, axis=-1)
            z = self.recurrent_activation(a_z + g_z)
            r = self.recurrent_activation(a_r + g_r)
            hh = self.activation(a_h + r * g_h)
        else:
            g_z, g_r = tf.split(
                self._recurrent_matmul(h_in, recurrent_kernel[..., : 2 * u]), 2, axis=-1
            )
            z = self.recurrent_activation(a_z + g_z)
            r = self.recurrent_activation(a_r + g_r)
            hh = self.activation(
                a_h + self._recurrent_matmul(r * h_in, recurrent_kernel[..., 2 * u :])
            )
        return (z * h + (1.0 - z) * hh,)

    def _curvature_statistics(self, xs, h_prev, recurrent_kernel, recurrent_bias):
        # r_t recomputed outside the loop exactly as in _step: reset_after needs r_t (the candidate's
        # recurrent pre-activation gradient is r_t * e_h), reset_before needs r_t * h_{t-1} (the
        # candidate's recurrent input).
        u = self.units
        g_r = self._recurrent_matmul(h_prev, recurrent_kernel[..., u : 2 * u])
        if self.reset_after and recurrent_bias is not None:
            g_r = g_r + recurrent_bias[..., u : 2 * u]
        r = self.recurrent_activation(xs[..., u : 2 * u] + g_r)
        if self.reset_after:
            return {"reset_gates": r}
        return {"reset_recurrent_inputs": r * h_prev}

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "recurrent_activation": keras.activations.serialize(self.recurrent_activation),
                "reset_after": self.reset_after,
            }
        )
        return config
