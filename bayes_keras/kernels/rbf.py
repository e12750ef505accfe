"""The Gaussian RBF kernel with the median-heuristic bandwidth."""

import keras
import tensorflow as tf

from bayes_keras.kernels.kernel import RadialKernel


@keras.saving.register_keras_serializable(package="bayes_keras")
class RBF(RadialKernel):
    """k(x, x') = exp(-||x - x'||^2 / h), the SVGD kernel of Liu & Wang (2016).

    Bandwidth convention (the default, as in the SVGD and matrix-valued SVGD papers): h = med / log N, where med is
    the median of the N(N-1)/2 squared distances between distinct particles (the zero diagonal is
    excluded) and N the number of particles. Then sum_j k(x_i, x_j) ~ 1 + N exp(-log N) = 2 for a
    typical particle: its own gradient and the others' weigh about equally. `divide_by_log_n=False`
    gives h = med, the convention of the authors' BNN code [C] (which also keeps the zero diagonal in
    the median; we do not). h is recomputed every step and is a constant of the step (stop-gradient).
    In a metric Q (matrix-valued SVGD) the same rule is applied to the squared Q-distances.

    Closed forms: with d2 = ||x_j - x_i||^2, grad_{x_j} k(x_j, x_i) = -(2 / h) k (x_j - x_i), so the
    SVGD repulsion is sum_j grad_{x_j} k(x_j, x_i) = (2 / h) sum_j k_ij (x_i - x_j).

    Args:
        bandwidth: "median" (default) or a fixed positive h.
        divide_by_log_n: with the median rule, divide by log N (default True).

    Example:
        >>> bayes_keras.optimizers.SVGD(1e-2, kernel=bayes_keras.kernels.RBF(bandwidth=0.5))
    """

    def profile(self, d2, h):
        k = tf.exp(-d2 / h)
        return k, -k / h
