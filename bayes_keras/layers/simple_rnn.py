"""Fully connected recurrent layer with one weight set per particle (see `_recurrent` for the layout)."""

import keras

from bayes_keras.curvature import rules
from bayes_keras.layers._recurrent import _ParticleRNN


@keras.saving.register_keras_serializable(package="bayes_keras")
class SimpleRNN(_ParticleRNN):
    """`keras.layers.SimpleRNN` with an (N, ...) stack of weight sets: h_t = act(x_t W + h_{t-1} U + b).

    Input (batch, T, F) on the layer that starts the particle axis, else (batch, N, T, F); output
    (batch, N, units), or (batch, N, T, units) with `return_sequences=True`. Weights: kernel
    (N, F, units), recurrent_kernel (N, units, units), bias (N, units); no N axis when deterministic.
    All particles and time steps share one input-projection matmul; the time loop is a graph loop.

    Further arguments:

    - units, activation, use_bias, kernel_initializer, recurrent_initializer, return_sequences,
      go_backwards, unroll: as in `keras.layers.SimpleRNN` (each particle is initialised
      independently; the recurrent kernel is orthogonal per particle by default).
    - num_particles, deterministic, kernel_prior, bias_prior: see `ParticleLayer`.
    - dropout, recurrent_dropout, seed: as in Keras, with one mask per sequence and particle (the same
      at every step, one for all gates): variational RNN dropout, in training only.

    Keras' stateful, return_state, regularizers and constraints are not implemented: non-default
    values raise ValueError. Masks (e.g. from Embedding(mask_zero=True)) are respected.

    Args:
        bias_initializer: default zeros when deterministic, N(0, 0.01^2) per particle otherwise
            (see `bayes_keras.layers.Dense`).
        recurrent_prior: prior of the recurrent kernel (default: the kernel prior).

    Example:
        >>> inputs = keras.Input((8, 8))                       # (batch, time, features)
        >>> h = bayes_keras.layers.SimpleRNN(32, num_particles=10)(inputs)   # (batch, 10, 32)
    """

    curvature_rules = rules.SIMPLE_RNN  # KFAC and squared-gradient formulas (curvature/rules.py)

    _gates = 1

    def _step(self, states, xw_t, recurrent_kernel, recurrent_bias, recurrent_keep=None):
        h = self.activation(
            xw_t
            + self._recurrent_matmul(self._dropped(states[0], recurrent_keep), recurrent_kernel)
        )
        return (h,)
