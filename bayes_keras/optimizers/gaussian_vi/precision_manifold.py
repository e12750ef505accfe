"""The manifold of positive-definite precisions, as MGVBP moves on it (Magris, Shabani & Iosifidis): the
retraction, its guard and the vector transport, for dense matrices (the full blocks' P and the Kronecker
factors A and G).

For a precision P and a symmetric step xi in its tangent space (https://arxiv.org/abs/2210.14598, Sec. 3):

    retraction  R_P(xi) = P + xi + 1/2 xi P^-1 xi = 1/2 P + 1/2 (P + xi) P^-1 (P + xi)     `retract_full`
    transport   T(m) = E m E^T,  E = (P_new P_old^-1)^(1/2)                               `transport_full`

R_P(xi) is positive definite for ANY symmetric xi; the eigenvalue check with step halving
(`retract_with_halving`) only guards against round-off.
"""

import tensorflow as tf


def symmetrize(a):
    return 0.5 * (a + tf.linalg.matrix_transpose(a))


# -- retraction, transport, guard ----------------------------------------------------------------
def retract_full(precision, xi, chol=None):
    """R_P(xi) = P + xi + 1/2 xi P^-1 xi (symmetrised). `chol`: P's Cholesky factor, if already known."""
    chol = tf.linalg.cholesky(precision) if chol is None else chol
    return symmetrize(precision + xi + 0.5 * tf.matmul(xi, tf.linalg.cholesky_solve(chol, xi)))


def is_positive_definite_full(precision):
    """True when P is finite, symmetric-positive-definite to working precision (smallest eigenvalue > 0).

    An eigenvalue check rather than a Cholesky attempt: TF's CPU Cholesky raises instead of
    returning NaN on a non-PD input, which a compiled step cannot catch.
    """
    finite = tf.reduce_all(tf.math.is_finite(precision))
    safe = tf.where(finite, precision, tf.eye(tf.shape(precision)[0], dtype=precision.dtype))
    return finite & (tf.reduce_min(tf.linalg.eigvalsh(safe)) > 0)


def retract_with_halving(precision, xi, retract, is_valid, max_halvings=5):
    """Try R_P(xi), R_P(xi / 2), ..., R_P(xi / 2^max_halvings); return the first valid one and its
    step factor, or (P unchanged, 0.0) when none is valid."""
    dtype = precision.dtype

    def cond(k, candidate, ok):
        return tf.logical_and(tf.logical_not(ok), k <= max_halvings)

    def body(k, candidate, ok):
        factor = tf.pow(tf.constant(0.5, dtype), tf.cast(k, dtype))
        candidate = retract(precision, factor * xi)
        return k + 1, candidate, is_valid(candidate)

    k, candidate, ok = tf.while_loop(cond, body, (tf.constant(0), precision, tf.constant(False)))
    factor = tf.where(
        ok, tf.pow(tf.constant(0.5, dtype), tf.cast(k - 1, dtype)), tf.constant(0.0, dtype)
    )
    return tf.where(ok, candidate, precision), factor


def _sqrt_and_inverse_sqrt(precision):
    w, u = tf.linalg.eigh(precision)
    w = tf.maximum(w, tf.reduce_max(w) * 1e-15)
    s = tf.sqrt(w)
    return tf.matmul(u * s, u, transpose_b=True), tf.matmul(u / s, u, transpose_b=True)


def transport_full(m, precision_old, precision_new):
    """Vector transport T(m) = E m E^T with E = (P_new P_old^-1)^(1/2), computed through the symmetric
    form E = P^1/2 (P^-1/2 P_new P^-1/2)^1/2 P^-1/2 (no non-symmetric matrix square root).
    T maps P_old itself to P_new."""
    root, inv_root = _sqrt_and_inverse_sqrt(precision_old)
    middle_root, _ = _sqrt_and_inverse_sqrt(
        symmetrize(tf.matmul(inv_root, tf.matmul(precision_new, inv_root)))
    )
    e = tf.matmul(root, tf.matmul(middle_root, inv_root))
    return symmetrize(tf.matmul(e, tf.matmul(m, e, transpose_b=True)))
