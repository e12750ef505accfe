"""Gaussian likelihood whose noise scale is predicted by the network (a mean head and a scale head)."""

import keras
import tensorflow as tf

from bayes_keras._config import check_number
from bayes_keras.likelihoods.normal import Normal


@keras.saving.register_keras_serializable(package="bayes_keras.likelihoods")
class HeteroscedasticNormal(Normal):
    """y ~ N(m + s f(x; w_n), (s sigma(x; w_n))^2 I) with outputs (batch, N, 2 d) = [f, r] and
    sigma = softplus(r) + min_scale: each particle predicts a mean and a noise scale per output dimension
    (Nix & Weigend 1994; Kendall & Gal 2017, https://arxiv.org/abs/1703.04977, Eq. 5), so the predictive
    mixture's intervals widen where the data are noisier.

    Standardisation (shift m, scale s) as in `Normal`: on by default, set by the first fit.

    Args:
        min_scale: floor on sigma in standardised units (keeps the density bounded).
        standardize: True (default) or False.

    Example:
        >>> h = bayes_keras.layers.Dense(50, activation="relu", num_particles=10)(inputs)
        >>> out = bayes_keras.layers.Dense(2)(h)            # mean and scale of one target
        >>> model = bayes_keras.BayesianModel(inputs, out, likelihood=bayes_keras.likelihoods.HeteroscedasticNormal())
    """

    name = "heteroscedastic_normal"

    def __init__(self, min_scale=1e-3, standardize=True):
        super().__init__(scale="learned", standardize=standardize)
        self.scale = "heteroscedastic"  # no shared learned scale: the network predicts it
        self.min_scale = check_number(min_scale, "HeteroscedasticNormal min_scale")

    @property
    def standardizes(self):
        return self.standardize is not False

    def check_output_shape(self, shape):
        if len(shape) != 3 or shape[-1] is None or shape[-1] % 2:
            raise ValueError(
                "HeteroscedasticNormal likelihood expects model outputs (batch, particles, 2 * output_dim): "
                f"means, then raw scales; got output shape {tuple(shape)}."
            )

    def output_dim(self, output_shape):
        return output_shape[-1] // 2

    def noise_scale(self, dtype=tf.float32):
        raise ValueError(
            "HeteroscedasticNormal predicts a noise scale per example: see model.uncertainty(x) "
            "(aleatoric_variance) or likelihood.loc_scale(outputs)."
        )

    def loc_scale(self, outputs):
        d = self.output_dim(outputs.shape)
        f, r = outputs[..., :d], outputs[..., d:]
        sigma = tf.nn.softplus(r) + tf.cast(self.min_scale, outputs.dtype)
        if self._shift is None:
            return f, sigma
        spread = tf.cast(self._spread, outputs.dtype)
        return tf.cast(self._shift, outputs.dtype) + spread * f, spread * sigma

    def get_config(self):
        return {"min_scale": self.min_scale, "standardize": self.standardize}
