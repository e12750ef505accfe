"""Signal share: how much of a running direction persists from step to step (SignalShare's step scale,
MatrixSVGD's rescaling and MGVBP's full-precision step sizes read it)."""

import tensorflow as tf


def signal_share(mean_square, square, correction):
    """|m_hat|^2 / v_hat = mean_square / (square * correction), clipped to [0, 1]: the share of a direction that
    persists from step to step, from the squared norm of its running mean (`mean_square`), the running mean of
    its squared norm (`square`) and their common bias correction 1 - decay^t (Jensen: at most 1). 1 where no
    direction has been seen (square 0)."""
    usable = square > 0.0
    share = mean_square / tf.where(usable, square * correction, tf.ones_like(square))
    return tf.where(usable, tf.minimum(share, 1.0), tf.ones_like(square))


def signal_fraction(mean_square, square, decay):
    """The share of a running mean's steps that is signal, beyond the noise floor: rho = `signal_share`(|m|^2,
    v) of the uncorrected averages m <- decay m + (1 - decay) step, v <- decay v + (1 - decay) |step|^2 lies in
    [0, 1]; steps of pure noise leave it at c = (1 - decay) / (1 + decay) on average, consistent steps at 1,
    so the signal's share is (rho - c) / (1 - c), clipped to [0, 1] (1 before any step, and for decay 0).
    Multiplied into a step size it moves fast while the steps agree and averages the noise once they do not
    (Balles, Romero & Hennig 2017, "Coupling Adaptive Batch Sizes with Learning Rates",
    https://arxiv.org/abs/1612.05086). Used by MGVBP's full-precision blocks."""
    rho = signal_share(mean_square, square, 1.0)
    noise = (1.0 - decay) / (1.0 + decay)
    share = tf.clip_by_value((rho - noise) / tf.maximum(1.0 - noise, 1e-6), 0.0, 1.0)
    return tf.where(decay > 0.0, share, tf.ones_like(share))
