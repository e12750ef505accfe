"""A layer's Kronecker factors: the dispatcher `kfac_factors`, the factor reductions the layer kinds
share, the pi-split damping and the true Fisher's label sampling."""

import tensorflow as tf

from bayes_keras.curvature.kinds import kronecker_rules
from bayes_keras.likelihoods import Likelihood

FISHER_TYPES = ("empirical", "true")


def kfac_factors(record, fisher="empirical"):
    """This batch's Kronecker factors of one layer (see the package docstring for the scale).

    Args:
        record: a `LayerRecord` with output gradients filled in (after BayesianModel's backward pass).
        fisher: "empirical" (observed labels) or "true" (labels sampled from the model).

    Returns:
        dict factor name -> (N, d, d) tensor, names as in `kronecker_spec(record.layer).factor_dims`.
    """
    if fisher not in FISHER_TYPES:
        raise ValueError(f"fisher must be one of {FISHER_TYPES}; got {fisher!r}.")
    e = record.output_gradients if fisher == "empirical" else record.sampled_output_gradients
    layer = record.layer
    if e is None:
        what = (
            "output_gradients"
            if fisher == "empirical"
            else "sampled_output_gradients (the optimizer's curvature_request must sample labels)"
        )
        raise ValueError(f"KFAC: the record of layer '{layer.name}' has no {what}.")
    if record.dataset_scale is None:
        raise ValueError(f"KFAC: the record of layer '{layer.name}' has no dataset_scale.")
    rules = kronecker_rules(layer)
    return rules.kronecker_factors(layer, record, e, tf.cast(record.dataset_scale, e.dtype))


def _particle_major(t):
    """(B, M, L, d) -> (M, B*L, d): the rows of each particle (or of the shared input, M = 1) contiguous, so
    that a factor is one batched matmul (faster than the equivalent einsum, which TF lowers to a
    contraction over two axes with transposes of both operands)."""
    m = t.shape[1] if t.shape[1] is not None else tf.shape(t)[1]
    d = t.shape[-1] if t.shape[-1] is not None else tf.shape(t)[-1]
    return tf.reshape(tf.transpose(t, (1, 0, 2, 3)), [m, -1, d])


def input_factor(a, homogeneous, n):
    """a (B, N or 1, L, p) -> (N, p[+1], p[+1]): mean over the B*L rows of a~ a~^T, a~ = [a; 1]."""
    rows = tf.cast(tf.shape(a)[0] * tf.shape(a)[2], a.dtype)
    flat = _particle_major(a)  # (N|1, B*L, p)
    second = tf.matmul(flat, flat, transpose_a=True) / rows
    if homogeneous:
        first = tf.reduce_sum(flat, axis=1) / rows  # (N|1, p)
        top = tf.concat([second, first[:, :, None]], axis=2)
        bottom = tf.concat([first[:, None, :], tf.ones_like(first[:, :1])[:, None, :]], axis=2)
        second = tf.concat([top, bottom], axis=1)
    if second.shape[0] != n:
        second = tf.broadcast_to(second, (n,) + tuple(second.shape[1:]))
    return second


def gradient_factor(e, scale):
    """e (B, N, L, q) -> (N, q, q): dataset_scale * sum over the B*L rows of e e^T."""
    flat = _particle_major(e)
    return scale * tf.matmul(flat, flat, transpose_a=True)


def split_damping(a, g, lam, split=True):
    """(pi sqrt(lambda), sqrt(lambda) / pi) added to A and G (batched over leading axes).

    pi = sqrt((tr A / dim A) / (tr G / dim G)) (1 when a trace is not positive, clipped to [1e-8, 1e8])."""
    # lam: a number (exact in a's dtype, not rounded through float32) or a tensor
    root = tf.sqrt(tf.cast(lam, a.dtype) if tf.is_tensor(lam) else tf.constant(lam, a.dtype))
    if not split:
        one = tf.ones(tf.shape(a)[:-2], a.dtype)
        return root * one, root * one
    ta = tf.linalg.trace(a) / tf.cast(tf.shape(a)[-1], a.dtype)
    tg = tf.linalg.trace(g) / tf.cast(tf.shape(g)[-1], g.dtype)
    ok = (ta > 0) & (tg > 0)
    pi = tf.where(ok, tf.sqrt(tf.where(ok, ta, 1.0) / tf.where(ok, tg, 1.0)), tf.ones_like(ta))
    pi = tf.clip_by_value(pi, 1e-8, 1e8)
    return pi * root, root / pi


def sampled_negative_log_likelihood(likelihood, outputs, seed=None):
    """-log p(y~_bn | x_b, w_n) (batch, N) for labels drawn from each particle's own predictive: the
    likelihood's own `sampled_negative_log_likelihood` (bayes_keras.likelihoods.Likelihood)."""
    if not isinstance(likelihood, Likelihood):
        raise ValueError(
            f"The true Fisher samples labels from a bayes_keras likelihood; {type(likelihood).__name__} "
            "is not supported. Use fisher='empirical'."
        )
    return likelihood.sampled_negative_log_likelihood(outputs, seed)
