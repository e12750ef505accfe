"""Kernel base class and the pairwise machinery shared by the SVGD kernels.

Conventions (used by every kernel, by bayes_keras.optimizers.svgd.stein and by MatrixSVGD):

- Particles come as a list of (N, d_v) tensors, one per flattened particle variable; the kernel acts
  on their concatenation x in R^D without ever concatenating.
- A kernel may be evaluated in a metric Q (a constant symmetric positive definite D x D matrix) by
  passing the images y = Q x (`ys`, a list like `xs`, possibly with leading batch axes, e.g. one Q per
  anchor of the mixture kernel). Then ||x - x'||_Q^2 = (x - x')^T Q (x - x') and <x, x'>_Q = x^T Q x'.
  `ys=None` is the Euclidean metric Q = I.
- `evaluate` returns the Gram K[..., i, j] = k_Q(x_i, x_j) and the REPULSION
      R_i = sum_j w_j Q^{-1} grad_{x_j} k_Q(x_j, x_i)                         (list of (..., N, d_v))
  in closed form (weights w_j default to 1). With Q = I this is the SVGD term
  sum_j grad_{x_j} k(x_j, x_i); with a metric Q it is the repulsion of the matrix-valued kernel
  K_Q = Q^{-1} k_Q (Wang et al. 2019, Eq. 13), whose divergence is Q^{-1} grad k_Q. Q and the
  bandwidth are constants of the step (stop-gradient), as in every SVGD implementation.
"""

import numpy as np
import tensorflow as tf

from bayes_keras._config import Configurable, config_repr

_MIN_BANDWIDTH = 1e-12


def _as_list(xs):
    return (list(xs), True) if isinstance(xs, (list, tuple)) else ([xs], False)


def _centre(x, axis):
    return x - tf.reduce_mean(x, axis=axis, keepdims=True)


def inner_products(xs, ys=None):
    """<x_i - m, Q (x_j - m)> for all pairs: (..., N, N), with the particles centred (better rounding;
    distances and the centred-linear kernel only need centred coordinates)."""
    xc = [_centre(x, 0) for x in xs]
    if ys is None:
        return tf.add_n([tf.matmul(x, x, transpose_b=True) for x in xc])
    yc = [_centre(y, -2) for y in ys]
    return tf.add_n([tf.einsum("id,...jd->...ij", x, y) for x, y in zip(xc, yc)])


def pairwise_sq_distances(xs, ys=None):
    """||x_i - x_j||_Q^2 for all pairs: (..., N, N), symmetric, zero diagonal, non-negative.

    Args:
        xs: list of (N, d_v) particle tensors (or one tensor).
        ys: None (Euclidean) or the metric images Q x, a list of (..., N, d_v).
    """
    xs, _ = _as_list(xs)
    ys = None if ys is None else _as_list(ys)[0]
    gram = inner_products(xs, ys)
    gram = 0.5 * (gram + tf.linalg.matrix_transpose(gram))
    sq = tf.linalg.diag_part(gram)
    d2 = sq[..., :, None] + sq[..., None, :] - 2.0 * gram
    d2 = tf.linalg.set_diag(tf.maximum(d2, 0.0), tf.zeros_like(sq))
    return d2


def median_offdiagonal(d2):
    """Median of the N(N-1)/2 entries above the diagonal of (..., N, N) matrices (midpoint of the two
    middle values for an even count, as numpy.median; equals np.median(scipy.spatial.distance.pdist(x,
    "sqeuclidean")) for squared distances). N = 1 has no pairs: returns 1."""
    n = int(d2.shape[-1])
    if n < 2:
        return tf.ones(tf.shape(d2)[:-2], d2.dtype)
    rows, cols = np.triu_indices(n, 1)
    flat = tf.reshape(d2, tf.concat([tf.shape(d2)[:-2], [n * n]], 0))
    values = tf.sort(tf.gather(flat, rows * n + cols, axis=-1), axis=-1)
    m = len(rows)
    if m % 2:
        return values[..., m // 2]
    return 0.5 * (values[..., m // 2 - 1] + values[..., m // 2])


class Kernel(Configurable):
    """Base class of SVGD kernels: small serializable objects.

    Subclasses implement `evaluate(xs, ys=None, weights=None) -> (K, R)` (see the module docstring
    for the exact meaning of K and the repulsion R) and `get_config`.
    """

    def evaluate(self, xs, ys=None, weights=None):
        raise NotImplementedError

    def __call__(self, xs, ys=None, weights=None):
        return self.evaluate(xs, ys, weights)

    def __repr__(self):
        return config_repr(self)


class RadialKernel(Kernel):
    """k(x, x') = f(||x - x'||_Q^2 / h) with a fixed or median-heuristic bandwidth h.

    Subclasses implement `profile(d2, h) -> (k, dk/d(d2))`. The repulsion is then
        R_i = sum_j w_j Q^{-1} grad_{x_j} k = 2 sum_j w_j k'(d2_ij) (x_j - x_i),
    since grad_{x_j} ||x_j - x_i||_Q^2 = 2 Q (x_j - x_i).

    Args:
        bandwidth: "median" (median heuristic, recomputed every call) or a positive float h.
        divide_by_log_n: with "median", h = med / log N instead of h = med, where med is the median of
            the squared distances between distinct particles (diagonal excluded).
    """

    default_divide_by_log_n = True

    def __init__(self, bandwidth="median", divide_by_log_n=None):
        if isinstance(bandwidth, str):
            if bandwidth != "median":
                raise ValueError(
                    f"{type(self).__name__} bandwidth must be 'median' or a positive number; "
                    f"got {bandwidth!r}."
                )
        elif (
            isinstance(bandwidth, bool)
            or not isinstance(bandwidth, (int, float, np.floating, np.integer))
            or not np.isfinite(bandwidth)
            or bandwidth <= 0
        ):
            raise ValueError(
                f"{type(self).__name__} bandwidth must be 'median' or a positive number; "
                f"got {bandwidth!r}."
            )
        else:
            bandwidth = float(bandwidth)
        self.bandwidth = bandwidth
        self.divide_by_log_n = (
            self.default_divide_by_log_n if divide_by_log_n is None else bool(divide_by_log_n)
        )

    def bandwidth_from(self, d2):
        """The bandwidth h (..., ) for squared distances d2 (..., N, N); a constant (stop-gradient)."""
        if self.bandwidth != "median":
            return tf.fill(tf.shape(d2)[:-2], tf.constant(self.bandwidth, d2.dtype))
        n = int(d2.shape[-1])
        h = median_offdiagonal(d2)
        if self.divide_by_log_n and n >= 2:
            h = h / float(np.log(n))
        return tf.stop_gradient(tf.maximum(h, _MIN_BANDWIDTH))

    def profile(self, d2, h):
        raise NotImplementedError

    def evaluate(self, xs, ys=None, weights=None):
        xs, is_list = _as_list(xs)
        d2 = pairwise_sq_distances(xs, ys)
        h = self.bandwidth_from(d2)[..., None, None]
        k, slope = self.profile(d2, h)
        if weights is not None:
            slope = slope * tf.cast(weights, slope.dtype)[..., None, :]
        row = tf.reduce_sum(slope, axis=-1, keepdims=True)
        rep = []
        for x in xs:
            xc = _centre(x, 0)
            rep.append(2.0 * (tf.einsum("...ij,jd->...id", slope, xc) - row * xc))
        return k, (rep if is_list else rep[0])

    def get_config(self):
        return {"bandwidth": self.bandwidth, "divide_by_log_n": self.divide_by_log_n}
