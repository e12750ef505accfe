"""The centred linear kernel: SVGD with it is Gaussian particle flow."""

import keras
import tensorflow as tf

from bayes_keras.kernels.kernel import Kernel, _as_list, _centre, inner_products


@keras.saving.register_keras_serializable(package="bayes_keras")
class CentredLinear(Kernel):
    """k(x, x') = 1 + (x - m)^T (x' - m), m = the particle mean (a constant of the step: stop-gradient).

    With this kernel SVGD's direction is exactly the Gaussian particle flow's (Galy-Fajou et al. 2021;
    Liu & Wang 2018 "SVGD as moment matching"): with g = grad of the NEGATIVE log density, z = x - m,
        phi(x_i) = (1/N) sum_j [(1 + z_j . z_i)(-g_j) + z_i] = -(g_bar + (1/N) sum_j (z_j . z_i) g_j - z_i),
    i.e. -Delta_i of bayes_keras.optimizers.gaussian_particle_flow_direction, with the same 1/N normalisation. The
    stop-gradient on m matters: differentiating through m would turn sum_j grad_{x_j} k(x_j, x_i) = N z_i
    into (N - 1) z_i and break the coincidence.

    Repulsion: grad_{x_j} k(x_j, x_i) = z_i for every j (in a metric Q: Q^{-1} grad = z_i as well).
    """

    def evaluate(self, xs, ys=None, weights=None):
        xs, is_list = _as_list(xs)
        ys = None if ys is None else _as_list(ys)[0]
        k = 1.0 + inner_products(xs, ys)
        if ys is not None:
            k = 0.5 * (k + tf.linalg.matrix_transpose(k))
        n = tf.cast(tf.shape(xs[0])[0], xs[0].dtype)
        total = (
            n
            if weights is None
            else tf.reduce_sum(tf.cast(weights, xs[0].dtype), axis=-1)[..., None, None]
        )
        rep = [total * _centre(x, 0) for x in xs]
        if ys is not None and weights is None:  # broadcast to the metric's batch shape
            batch = tf.shape(k)[:-2]
            rep = [tf.broadcast_to(r, tf.concat([batch, tf.shape(r)], 0)) for r in rep]
        return k, (rep if is_list else rep[0])
