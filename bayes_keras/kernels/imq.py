"""The inverse multiquadric kernel."""

import keras
import numpy as np
import tensorflow as tf

from bayes_keras.kernels.kernel import RadialKernel


@keras.saving.register_keras_serializable(package="bayes_keras")
class IMQ(RadialKernel):
    """k(x, x') = (1 + ||x - x'||^2 / h)^beta, beta < 0 (default -1/2: the inverse multiquadric).

    Heavy tails: distant particles still interact, unlike the RBF kernel whose repulsion vanishes
    exponentially (Gorham & Mackey 2017 use beta in (-1, 0) for kernel Stein discrepancies).

    Bandwidth: as RBF, but by default h = med (no log N; the authors' code [C] uses the plain median
    for IMQ): med = median squared distance between distinct particles, stop-gradient.

    Closed form: grad_{x_j} k(x_j, x_i) = (2 beta / h) (1 + d2 / h)^(beta - 1) (x_j - x_i).

    Args:
        bandwidth: "median" (default) or a fixed positive h.
        beta: negative exponent (default -0.5).
        divide_by_log_n: with the median rule, divide the median by log N (default False).
    """

    default_divide_by_log_n = False

    def __init__(self, bandwidth="median", beta=-0.5, divide_by_log_n=None):
        super().__init__(bandwidth, divide_by_log_n)
        if (
            isinstance(beta, bool)
            or not isinstance(beta, (int, float, np.floating, np.integer))
            or not np.isfinite(beta)
            or beta >= 0
        ):
            raise ValueError(f"IMQ beta must be a negative number (e.g. -0.5); got {beta!r}.")
        self.beta = float(beta)

    def profile(self, d2, h):
        u = 1.0 + d2 / h
        k = tf.pow(u, self.beta)
        return k, self.beta * k / (u * h)

    def get_config(self):
        config = super().get_config()
        config["beta"] = self.beta
        return config
