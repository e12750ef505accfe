"""A log density as the target of local refinement (the functional door)."""

import numpy as np
import tensorflow as tf


class DensityTarget:
    """ell(w) = log_likelihood(w), with a given Gaussian prior and base diagonal Gaussian; no data."""

    def __init__(self, log_likelihood, mean, stddev, prior_loc, prior_scale, dtype, eval_samples):
        self.log_likelihood = log_likelihood
        self.dtype = tf.as_dtype(dtype)
        mean, stddev = np.asarray(mean, np.float64).ravel(), np.asarray(stddev, np.float64).ravel()
        if mean.shape != stddev.shape or not mean.size:
            raise ValueError(
                f"mean and stddev must be (D,) arrays of one shape; got {mean.shape} and {stddev.shape}."
            )
        if not np.all(np.isfinite(mean)) or not np.all(np.isfinite(stddev)) or np.any(stddev <= 0):
            raise ValueError(
                "The base posterior needs finite means and positive, finite standard deviations."
            )
        self.dim = mean.size
        self._mean, self._var = mean, stddev**2
        loc = np.broadcast_to(np.asarray(prior_loc, np.float64), mean.shape)
        scale = np.broadcast_to(np.asarray(prior_scale, np.float64), mean.shape)
        if not np.all(np.isfinite(loc)) or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise ValueError("prior_loc must be finite and prior_scale positive and finite.")
        self._loc, self._prior_var = loc.copy(), scale**2
        if isinstance(eval_samples, bool) or int(eval_samples) != eval_samples or eval_samples < 1:
            raise ValueError(f"eval_samples must be a positive integer; got {eval_samples!r}.")
        self.eval_samples = int(eval_samples)
        self.last_samples = None

    def base_posterior(self):
        return self._mean, self._var

    def prior(self):
        return self._loc, self._prior_var

    def next_batch(self):
        return ()

    def value_and_gradient(self, w, batch):
        with tf.GradientTape() as tape:
            tape.watch(w)
            ell = tf.cast(self.log_likelihood(w), w.dtype)
        return ell, tape.gradient(ell, w)

    def expected_log_likelihood(self, stages):
        w = stages.sample((self.eval_samples,))  # (S, M, D), evaluated in one call
        values = self.log_likelihood(tf.reshape(w, (-1, self.dim)))
        return tf.reduce_mean(
            tf.reshape(tf.cast(values, tf.float64), (self.eval_samples, -1)), axis=0
        ).numpy()

    def assign_samples(self, w):
        self.last_samples = np.asarray(w)
