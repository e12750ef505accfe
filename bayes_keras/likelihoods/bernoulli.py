"""Bernoulli likelihood over per-particle logits."""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.likelihoods.likelihood import Likelihood, entropy_decomposition, label_vector

tfd = tfp.distributions


@keras.saving.register_keras_serializable(package="bayes_keras.likelihoods")
class Bernoulli(Likelihood):
    """y ~ Bernoulli(sigmoid(f(x; w_n))), outputs (batch, N) or (batch, N, 1) logits, labels in {0, 1}.

    `model.predict` returns the predictive probability of y = 1, shape (batch,).
    Equivalent Keras loss: "binary_crossentropy" (from_logits=True).

    Example:
        >>> model = bayes_keras.BayesianModel(inputs, logit, likelihood="bernoulli")
    """

    name = "bernoulli"
    outputs_are_logits = True

    def check_output_shape(self, shape):
        if not (len(shape) == 2 or (len(shape) == 3 and shape[-1] == 1)):
            raise ValueError(
                "Bernoulli likelihood expects model outputs (batch, particles) or (batch, particles, 1) "
                f"of logits; got output shape {tuple(shape)}."
            )

    def _logits(self, outputs):
        return outputs[..., 0] if outputs.shape.rank == 3 else outputs

    def check_targets(self, y, output_shape, what, name="y"):
        super().check_targets(y, output_shape, what, name)
        if y.size and not np.all((y == 0) | (y == 1)):
            raise ValueError(
                f"{what}: {name} must be 0 or 1 (Bernoulli labels); got values such as "
                f"{float(y[(y != 0) & (y != 1)].reshape(-1)[0]):g}."
            )

    def log_prob(self, y, outputs):
        y = label_vector(
            tf.convert_to_tensor(y),
            "Bernoulli likelihood expects labels of shape (batch,) or (batch, 1)",
        )
        y = tf.cast(y, outputs.dtype)
        with tf.control_dependencies(
            [
                tf.debugging.assert_equal(
                    tf.logical_or(tf.equal(y, 0.0), tf.equal(y, 1.0)),
                    True,
                    message="Bernoulli labels must be 0 or 1",
                )
            ]
        ):
            y = tf.identity(y)
        logits = self._logits(outputs)
        return -tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.broadcast_to(y[:, None], tf.shape(logits)), logits=logits
        )

    def summary(self, outputs):
        return tf.reduce_mean(tf.sigmoid(self._logits(outputs)), axis=1)

    def predictive(self, outputs):
        return tfd.Bernoulli(probs=self.summary(outputs))

    def uncertainty(self, outputs):
        p = tf.sigmoid(self._logits(outputs))[..., None]
        return entropy_decomposition(tf.concat([1.0 - p, p], axis=-1))

    def accuracy_metric(self, name):
        # on the predictive probability, threshold 0.5
        return keras.metrics.BinaryAccuracy(name=name)

    def sampled_negative_log_likelihood(self, outputs, seed=None):
        logits = self._logits(outputs)
        p = tf.sigmoid(tf.stop_gradient(logits))
        u = (
            tf.random.uniform(tf.shape(p), dtype=p.dtype)
            if seed is None
            else tf.random.stateless_uniform(tf.shape(p), seed, dtype=p.dtype)
        )
        labels = tf.cast(u < p, logits.dtype)
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
