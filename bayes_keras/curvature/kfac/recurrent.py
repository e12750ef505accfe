"""KFAC of SimpleRNN, LSTM and GRU layers: the input and recurrent blocks' specs and factors."""

import tensorflow as tf

from bayes_keras.curvature.kfac.factors import gradient_factor, input_factor
from bayes_keras.curvature.kfac.specs import spec
from bayes_keras.curvature.kinds import layer_kind


def recurrent_spec(layer, reset_after=None):
    """Kronecker spec of a SimpleRNN or LSTM particle layer: an input and a recurrent block (a GRU's, with
    its `reset_after`: `gru_spec`)."""
    return spec(
        layer_kind(layer),
        layer.kernel,
        getattr(layer, "bias", None),
        layer.recurrent_kernel,
        int(layer.units),
        reset_after,
        layer,
    )


def gru_spec(layer):
    """Kronecker spec of a GRU particle layer: an input block and, by its `reset_after`, one recurrent block
    (reset after the recurrent matmul) or two (the update / reset gates' and the candidate's)."""
    return recurrent_spec(layer, bool(layer.reset_after))


def recurrent_factors(layer, record, e, scale, reset_after=None):
    """The input and recurrent factors of a SimpleRNN or LSTM particle layer (the T time steps are the
    locations); a GRU's through `gru_factors`."""
    extras = record.extras or {}
    if "recurrent_inputs" not in extras:
        raise ValueError(
            f"KFAC: the record of recurrent layer '{layer.name}' has no recurrent inputs (h_(t-1))."
        )
    n, batch = int(layer.num_particles), tf.shape(e)[0]
    has_bias = getattr(layer, "bias", None) is not None
    units, width = int(layer.units), int(layer.kernel.shape[2])
    features = int(layer.kernel.shape[1])
    # A first layer's input is (B, T, F), one for all particles, unless input dropout gave it the N axis.
    x = tf.reshape(record.inputs, (batch, 1 if len(record.inputs.shape) == 3 else n, -1, features))
    e = tf.reshape(e, (batch, n, -1, width))
    h_prev = tf.reshape(extras["recurrent_inputs"], (batch, n, -1, units))
    factors = {"A_in": input_factor(x, has_bias, n), "G": gradient_factor(e, scale)}
    if reset_after:
        r = tf.reshape(extras["reset_gates"], (batch, n, -1, units))
        e_rec = tf.concat([e[..., : 2 * units], r * e[..., 2 * units :]], axis=-1)
        factors["A_rec"] = input_factor(h_prev, has_bias, n)
        factors["G_rec"] = gradient_factor(e_rec, scale)
    elif reset_after is False:
        factors["A_rec"] = input_factor(h_prev, False, n)
        factors["A_reset"] = input_factor(
            tf.reshape(extras["reset_recurrent_inputs"], (batch, n, -1, units)), False, n
        )
    else:
        factors["A_rec"] = input_factor(h_prev, False, n)
    return factors


def gru_factors(layer, record, e, scale):
    """The factors of a GRU particle layer: the input block's, and by `reset_after` (see the package docstring)
    the recurrent block's over the reset-gated output gradients, or the update / reset gates' and the
    candidate's over the reset-gated recurrent inputs."""
    return recurrent_factors(layer, record, e, scale, bool(layer.reset_after))
