"""Categorical likelihood over per-particle logits."""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.likelihoods.likelihood import (
    Likelihood,
    entropy_decomposition,
    label_vector,
    shape_text,
)

tfd = tfp.distributions


@keras.saving.register_keras_serializable(package="bayes_keras.likelihoods")
class Categorical(Likelihood):
    """y ~ Categorical(softmax(f(x; w_n))), outputs (batch, N, K) logits, labels integers in [0, K).

    Labels may be shaped (batch,) or (batch, 1) (the Keras sparse convention).
    `model.predict` returns the posterior predictive probabilities (batch, K): the particle mean
    of the softmax outputs. Equivalent Keras loss: "sparse_categorical_crossentropy".

    Example:
        >>> model = bayes_keras.BayesianModel(inputs, logits, likelihood=bayes_keras.likelihoods.Categorical())
    """

    name = "categorical"
    outputs_are_logits = True

    def check_output_shape(self, shape):
        if len(shape) != 3 or (shape[-1] is not None and shape[-1] < 2):
            raise ValueError(
                "Categorical likelihood expects model outputs (batch, particles, num_classes) with "
                f"num_classes >= 2 (logits); got output shape {tuple(shape)}. For a binary output "
                "with one logit use likelihood='bernoulli'."
            )

    def check_targets(self, y, output_shape, what, name="y"):
        super().check_targets(y, output_shape, what, name)
        if y.size and y.dtype.kind == "f" and not np.all(y == np.round(y)):
            raise ValueError(
                f"{what}: {name} must be class indices (whole numbers); got values such as "
                f"{float(y[y != np.round(y)].reshape(-1)[0])}."
            )
        classes = output_shape[-1] if output_shape else None
        if y.size and classes is not None and (y.min() < 0 or y.max() >= classes):
            raise ValueError(
                f"{what}: {name} must be class labels in [0, {classes}) (the model has {classes} "
                f"outputs); got labels from {y.min():g} to {y.max():g}."
            )

    def _labels(self, y, outputs):
        y = label_vector(
            tf.convert_to_tensor(y),
            "Categorical likelihood expects integer labels of shape (batch,) or (batch, 1) (one-hot "
            f"labels: pass argmax(y, -1)) for outputs {shape_text(outputs.shape)}",
        )
        checks = []
        # float class indices (e.g. a float array of labels) must be whole numbers
        if y.dtype.is_floating:
            fractional = tf.not_equal(y, tf.round(y))
            checks.append(
                tf.debugging.Assert(
                    tf.logical_not(tf.reduce_any(fractional)),
                    [
                        "Categorical labels are class indices and must be whole numbers; got labels such as",
                        tf.boolean_mask(y, fractional),
                    ],
                    summarize=3,
                )
            )
            y = tf.round(y)
        y = tf.cast(y, tf.int32)
        k = tf.shape(outputs)[-1]
        low, high = tf.reduce_min(y), tf.reduce_max(y)
        # the batch's smallest and largest label in the message, not its first few labels
        checks.append(
            tf.debugging.Assert(
                tf.logical_and(low >= 0, high < k),
                [
                    "Categorical labels must be in [0, num_classes) with num_classes =",
                    k,
                    "; got labels from",
                    low,
                    "to",
                    high,
                ],
            )
        )
        with tf.control_dependencies(checks):
            return tf.identity(y)

    def log_prob(self, y, outputs):
        y = self._labels(y, outputs)
        logp = tf.nn.log_softmax(outputs, axis=-1)
        n = tf.shape(outputs)[1]
        idx = tf.tile(y[:, None, None], [1, n, 1])
        return tf.squeeze(tf.gather(logp, idx, axis=-1, batch_dims=2), -1)

    def probs(self, outputs):
        return tf.nn.softmax(outputs, axis=-1)

    def summary(self, outputs):
        return tf.reduce_mean(self.probs(outputs), axis=1)

    def predictive(self, outputs):
        return tfd.Categorical(probs=self.summary(outputs))

    def uncertainty(self, outputs):
        return entropy_decomposition(self.probs(outputs))

    def accuracy_metric(self, name):
        # integer labels, as log_prob takes them
        return keras.metrics.SparseCategoricalAccuracy(name=name)

    def sampled_negative_log_likelihood(self, outputs, seed=None):
        logits = outputs
        k = tf.shape(logits)[-1]
        flat = tf.reshape(tf.stop_gradient(logits), (-1, k))
        draw = (
            tf.random.categorical(flat, 1, dtype=tf.int32)
            if seed is None
            else tf.random.stateless_categorical(flat, 1, seed, dtype=tf.int32)
        )
        # non-finite logits (a step the model's guard then skips) can draw index k: keep it in range
        labels = tf.reshape(tf.minimum(draw, k - 1), tf.shape(logits)[:-1])
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
