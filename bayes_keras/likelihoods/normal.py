"""Gaussian likelihood with a fixed or learned (homoscedastic) noise scale."""

import math

import keras
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.likelihoods.likelihood import LOG_2PI, Likelihood

tfd = tfp.distributions


@keras.saving.register_keras_serializable(package="bayes_keras.likelihoods")
class Normal(Likelihood):
    """y ~ N(f(x; w_n), sigma^2 I), outputs (batch, N, d) means.

    Args:
        scale: fixed noise standard deviation (float), or "learned": a per-output-dimension
            log-scale shared by all particles, fitted by maximum likelihood (type-II / empirical
            Bayes) with the optimizer's shared-variable rule.
        initial_scale: starting value when learned.

    `model.predict` returns {"mean": (batch, d), "std": (batch, d)} of the predictive mixture.
    Equivalent Keras loss: "mse" (with scale=1 up to constants).

    Example:
        >>> model = bayes_keras.BayesianModel(inputs, mean, likelihood=bayes_keras.likelihoods.Normal(scale="learned"))
    """

    name = "normal"

    def __init__(self, scale=1.0, initial_scale=1.0):
        if scale != "learned" and not (isinstance(scale, (int, float)) and scale > 0):
            raise ValueError(f"Normal likelihood scale must be a positive float or 'learned'; got {scale!r}.")
        self.scale = scale
        self.initial_scale = float(initial_scale)
        self._log_scale = None

    def build(self, model, output_shape):
        super().build(model, output_shape)
        if self.scale == "learned" and self._log_scale is None:
            self._log_scale = model.add_weight(
                name="likelihood_log_scale", shape=(output_shape[-1],),
                initializer=keras.initializers.Constant(math.log(self.initial_scale)))

    @property
    def variables(self):
        return [self._log_scale] if self._log_scale is not None else []

    def check_output_shape(self, shape):
        if len(shape) != 3 or shape[-1] is None:
            raise ValueError(
                "Normal likelihood expects model outputs (batch, particles, output_dim); got output "
                f"shape {tuple(shape)}."
            )

    def noise_scale(self, dtype=tf.float32):
        if self._log_scale is not None:
            return tf.exp(tf.cast(self._log_scale, dtype))
        return tf.constant(float(self.scale), dtype)

    def _targets(self, y, outputs):
        y = tf.cast(tf.convert_to_tensor(y), outputs.dtype)
        if y.shape.rank == 1:
            y = y[:, None]
        if y.shape.rank != 2 or (y.shape[-1] is not None and y.shape[-1] != outputs.shape[-1]):
            raise ValueError(
                f"Normal likelihood expects targets (batch, {outputs.shape[-1]}) (or (batch,) when the "
                f"output dimension is 1) for outputs {tuple(outputs.shape)}; got targets of shape {tuple(y.shape)}."
            )
        return y

    def log_prob(self, y, outputs):
        y = self._targets(y, outputs)
        s = self.noise_scale(outputs.dtype)
        z = (y[:, None, :] - outputs) / s
        return tf.reduce_sum(-0.5 * tf.square(z) - tf.math.log(s) - 0.5 * LOG_2PI, axis=-1)

    def _components(self, outputs):
        scale = tf.broadcast_to(self.noise_scale(outputs.dtype), tf.shape(outputs))
        return tfd.Independent(tfd.Normal(outputs, scale), reinterpreted_batch_ndims=1)

    def predictive(self, outputs):
        mix = tfd.Categorical(logits=tf.zeros(tf.shape(outputs)[:2], outputs.dtype))
        return tfd.MixtureSameFamily(mix, self._components(outputs))

    def uncertainty(self, outputs):
        aleatoric = tf.broadcast_to(tf.square(self.noise_scale(outputs.dtype)), tf.shape(outputs[:, 0]))
        epistemic = tf.math.reduce_variance(outputs, axis=1)
        return {"total_variance": aleatoric + epistemic, "aleatoric_variance": aleatoric,
                "epistemic_variance": epistemic}

    def summary(self, outputs):
        u = self.uncertainty(outputs)
        return {"mean": tf.reduce_mean(outputs, axis=1), "std": tf.sqrt(u["total_variance"])}

    def sampled_negative_log_likelihood(self, outputs, seed=None):
        s = tf.stop_gradient(self.noise_scale(outputs.dtype))
        eps = (tf.random.normal(tf.shape(outputs), dtype=outputs.dtype) if seed is None
               else tf.random.stateless_normal(tf.shape(outputs), seed, dtype=outputs.dtype))
        y = tf.stop_gradient(outputs + s * eps)
        z = (y - outputs) / s
        return tf.reduce_sum(0.5 * tf.square(z) + tf.math.log(s) + 0.5 * LOG_2PI, axis=-1)

    def get_config(self):
        return {"scale": self.scale, "initial_scale": self.initial_scale}
