"""Gaussian likelihood with a learned or fixed (homoscedastic) noise scale and target standardisation."""

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras._config import check_number
from bayes_keras.likelihoods.likelihood import LOG_2PI, Likelihood, shape_text, target_matrix
from bayes_keras.likelihoods.particle_mixture import ParticleMixture
from bayes_keras.saving.loaded_state import check_bounded_entry, check_finite_entries

tfd = tfp.distributions


@keras.saving.register_keras_serializable(package="bayes_keras.likelihoods")
class Normal(Likelihood):
    """y ~ N(m + s f(x; w_n), (s sigma)^2 I), outputs f (batch, N, d).

    With `standardize` (the default with a learned scale) the network works in standardised units: the
    shift m and scale s are the training targets' mean and standard deviation per output dimension, set
    once by the first `fit` (`adapt`; saved with the model), and every prediction is mapped back to the
    targets' units. So the default model is calibrated on raw targets (e.g. diabetes, sd 77): N(0, 1) weight
    priors and a noise scale starting at the data's spread fit a standardised problem. Without it
    (m = 0, s = 1) the network predicts the targets directly, as a conjugate model written by hand does.

    Args:
        scale: "learned" (default): a per-output-dimension log noise scale shared by all particles, fitted by
            maximum likelihood (type-II / empirical Bayes) with the optimizer's shared-variable rule; or a
            fixed noise standard deviation in the targets' units (float).
        initial_scale: starting noise scale when learned, in standardised units when standardising
            (1.0: the targets' own spread), else in the targets' units.
        standardize: None (default): standardise exactly when the scale is learned; True / False to choose.

    `model.predict` returns {"mean": (batch, d), "std": (batch, d)} of the predictive mixture;
    `model.predictive(x)` is a `ParticleMixture` with exact quantiles. Equivalent Keras loss: "mse".

    Example:
        >>> model = bayes_keras.BayesianModel(inputs, mean, likelihood="normal")   # learned, standardised
        >>> model.fit(x, y_raw, epochs=40)
        >>> dist = model.predictive(x_test)
        >>> lower, upper = dist.quantile(0.025), dist.quantile(0.975)
    """

    name = "normal"
    continuous = True

    def __init__(self, scale="learned", initial_scale=1.0, standardize=None):
        if scale != "learned":
            scale = check_number(scale, "Normal likelihood scale (a positive float or 'learned')")
        self.scale = scale
        self.initial_scale = check_number(initial_scale, "Normal likelihood initial_scale")
        if standardize is not None and not isinstance(standardize, bool):
            raise ValueError(
                f"Normal likelihood standardize must be None, True or False; got {standardize!r}."
            )
        self.standardize = standardize
        self._log_scale = None
        self._shift = self._spread = self._adapted = None
        # adapted before the model was built (a subclassed model)
        self._pending_standardization = None

    @property
    def standardizes(self):
        return self.scale == "learned" if self.standardize is None else self.standardize

    def build(self, model, output_shape):
        super().build(model, output_shape)
        d = self.output_dim(output_shape)
        if self.scale == "learned" and self._log_scale is None:
            self._log_scale = model.add_weight(
                name="likelihood_log_scale",
                shape=(d,),
                initializer=keras.initializers.Constant(math.log(self.initial_scale)),
            )
        if self.standardizes and self._shift is None:
            self._shift = model.add_weight(
                name="likelihood_target_shift", shape=(d,), initializer="zeros", trainable=False
            )
            self._spread = model.add_weight(
                name="likelihood_target_scale", shape=(d,), initializer="ones", trainable=False
            )
            self._adapted = model.add_weight(
                name="likelihood_adapted", shape=(), initializer="zeros", trainable=False
            )
            if self._pending_standardization is not None:
                self._set_standardization(*self._pending_standardization)

    @property
    def variables(self):
        return [self._log_scale] if self._log_scale is not None else []

    def check_loaded_state(self, owner):
        """The noise scale's log finite and within +-50 (exp(+-88) leaves float32), the target shift finite, the
        target scale finite and positive, the adapted flag 0 or 1."""
        what = "the likelihood of model"
        check_finite_entries(
            owner, [v for v in (self._log_scale, self._shift, self._spread) if v is not None], what
        )
        if self._log_scale is not None:
            check_bounded_entry(
                owner, self._log_scale, what, "log noise scale", within=(-50.0, 50.0)
            )
        if self._spread is not None:
            check_bounded_entry(owner, self._spread, what, "target scale", positive=True)
            check_bounded_entry(owner, self._adapted, what, "adapted flag", within=(0.0, 1.0))

    @property
    def adapt_pending(self):
        if not self.standardizes:
            return False
        if self._adapted is None:  # not built yet
            return self._pending_standardization is None
        return float(self._adapted.numpy()) == 0.0

    def adapt(self, targets):
        """Set the standardisation (mean and sd per output dimension) from the training targets: an array
        (n,) / (n, d), or a tf.data.Dataset of target batches (one pass, moments accumulated in float64)."""
        if not self.standardizes:
            return
        count, total, total_sq = 0.0, 0.0, 0.0
        batches = targets if isinstance(targets, tf.data.Dataset) else [targets]
        for batch in batches:
            batch = np.asarray(batch, np.float64)
            batch = batch.reshape(len(batch), -1)
            count += len(batch)
            total = total + batch.sum(0)
            total_sq = total_sq + (batch**2).sum(0)
        if count == 0:
            raise ValueError("Normal likelihood: no targets to standardise with.")
        mean = np.asarray(total / count)
        var = np.asarray(total_sq / count) - mean**2
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
            raise ValueError("Normal likelihood: the training targets contain NaN or Inf.")
        spread = np.sqrt(np.maximum(var, 0.0))
        # constant target
        spread = np.where(spread > 1e-12 * np.maximum(np.abs(mean), 1.0), spread, 1.0)
        if self._shift is None:
            self._pending_standardization = (mean, spread)
        else:
            self._set_standardization(mean, spread)

    def _set_standardization(self, mean, spread):
        d = self._shift.shape[0]
        if mean.shape not in ((d,), (1,)):
            raise ValueError(
                f"Normal likelihood: targets with {mean.shape[0]} columns for a model with {d} "
                "outputs."
            )
        self._shift.assign(np.broadcast_to(mean, (d,)))
        self._spread.assign(np.broadcast_to(spread, (d,)))
        self._adapted.assign(1.0)

    def check_output_shape(self, shape):
        if len(shape) != 3 or shape[-1] is None:
            raise ValueError(
                "Normal likelihood expects model outputs (batch, particles, output_dim); got output "
                f"shape {tuple(shape)}."
            )

    def noise_scale(self, dtype=tf.float32):
        """The noise standard deviation in the targets' units, (d,) (or a scalar when fixed)."""
        sigma = (
            tf.exp(tf.cast(self._log_scale, dtype))
            if self._log_scale is not None
            else tf.constant(float(self.scale), dtype)
        )
        return sigma if self._spread is None else sigma * tf.cast(self._spread, dtype)

    def loc_scale(self, outputs):
        """(loc, scale), each broadcastable to (batch, N, d): the per-particle Gaussians in target units."""
        scale = self.noise_scale(outputs.dtype)
        if self._shift is None:
            return outputs, scale
        return tf.cast(self._shift, outputs.dtype) + tf.cast(
            self._spread, outputs.dtype
        ) * outputs, scale

    def output_dim(self, output_shape):
        """d, the number of target columns, from the model's output shape (batch, N, d)."""
        return output_shape[-1]

    def _targets(self, y, outputs):
        y = tf.cast(tf.convert_to_tensor(y), outputs.dtype)
        d = self.output_dim(outputs.shape)
        return target_matrix(
            y,
            d,
            f"{type(self).__name__} likelihood expects targets (batch, {d}) (or (batch,) when "
            f"the output dimension is 1) for outputs {shape_text(outputs.shape)}",
        )

    def log_prob(self, y, outputs):
        y = self._targets(y, outputs)
        loc, scale = self.loc_scale(outputs)
        scale = tf.broadcast_to(scale, tf.shape(loc))
        z = (y[:, None, :] - loc) / scale
        return tf.reduce_sum(-0.5 * tf.square(z) - tf.math.log(scale) - 0.5 * LOG_2PI, axis=-1)

    def predictive(self, outputs):
        loc, scale = self.loc_scale(outputs)
        components = tfd.Independent(
            tfd.Normal(loc, tf.broadcast_to(scale, tf.shape(loc))), reinterpreted_batch_ndims=1
        )
        mix = tfd.Categorical(logits=tf.zeros(tf.shape(loc)[:2], loc.dtype))
        return ParticleMixture(mix, components)

    def predictive_interval(self, outputs, level):
        predictive = self.predictive(outputs)
        return predictive.quantile(0.5 * (1.0 - level)), predictive.quantile(0.5 * (1.0 + level))

    def uncertainty(self, outputs):
        loc, scale = self.loc_scale(outputs)
        aleatoric = tf.reduce_mean(tf.broadcast_to(tf.square(scale), tf.shape(loc)), axis=1)
        epistemic = tf.math.reduce_variance(loc, axis=1)
        return {
            "total_variance": aleatoric + epistemic,
            "aleatoric_variance": aleatoric,
            "epistemic_variance": epistemic,
        }

    def summary(self, outputs):
        loc, _ = self.loc_scale(outputs)
        u = self.uncertainty(outputs)
        return {"mean": tf.reduce_mean(loc, axis=1), "std": tf.sqrt(u["total_variance"])}

    def sampled_negative_log_likelihood(self, outputs, seed=None):
        loc, scale = self.loc_scale(outputs)
        scale = tf.stop_gradient(tf.broadcast_to(scale, tf.shape(loc)))
        eps = (
            tf.random.normal(tf.shape(loc), dtype=loc.dtype)
            if seed is None
            else tf.random.stateless_normal(tf.shape(loc), seed, dtype=loc.dtype)
        )
        y = tf.stop_gradient(loc + scale * eps)
        z = (y - loc) / scale
        return tf.reduce_sum(0.5 * tf.square(z) + tf.math.log(scale) + 0.5 * LOG_2PI, axis=-1)

    def get_config(self):
        return {
            "scale": self.scale,
            "initial_scale": self.initial_scale,
            "standardize": self.standardize,
        }
