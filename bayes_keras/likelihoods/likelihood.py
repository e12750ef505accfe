"""Base class of observation models p(y | x, w) evaluated on (batch, particles, ...) outputs."""

import math

import keras
import numpy as np
import tensorflow as tf

from bayes_keras._config import Configurable


class Likelihood(Configurable):
    """An observation model over the network's per-particle outputs.

    `outputs` always has layout (batch, N, ...). Subclasses implement:
      - `check_output_shape(shape)`: raise a ValueError naming the expected output shape.
      - `log_prob(y, outputs)` -> (batch, N): log p(y_b | x_b, w_n).
      - `predictive(outputs)`: the posterior predictive as a TFP distribution, batch shape (batch,).
      - `summary(outputs)`: what `model.predict` returns.
      - `uncertainty(outputs)`: dict of (batch,) tensors (total = aleatoric + epistemic).
    and may implement:
      - `adapt(targets)` with `adapt_pending`: constants fitted to the training targets (Normal's
        standardisation), which BayesianModel.fit sets before its first step.
      - `accuracy_metric(name)`: the Keras metric that "accuracy" in `compile(metrics=[...])` means.
      - `predictive_interval(outputs, level)`: central predictive intervals (regression).
    and, for the true Fisher (labels drawn from the model: KFAC(fisher="true"), MGVBP(curvature="fisher")):
      - `sampled_negative_log_likelihood(outputs, seed)` -> (batch, N).
    """

    name = "likelihood"
    continuous = False  # True: the predictive is a ParticleMixture with quantiles (regression)
    # True: outputs are logits (a softmax / sigmoid output layer is refused)
    outputs_are_logits = False

    def build(self, model, output_shape):
        """Create any variables (e.g. a learned noise scale) on `model`. Called once."""
        self.check_output_shape(output_shape)

    @property
    def variables(self):
        return []

    def check_loaded_state(self, owner):
        """Raise a ValueError naming the entry if state read back from a file is one this likelihood never holds
        (a NaN noise scale, a negative target scale). Likelihoods without state have nothing to check."""

    def check_targets(self, y, output_shape, what, name="y"):
        """Refuse in-memory targets (a numpy array) this likelihood cannot score, before any work, with a
        ValueError naming `name` and the values. Here: numbers, finite."""
        if y.dtype.kind in "USOV":
            raise ValueError(
                f"{what}: {name} holds {y.dtype} values; {self.name} targets are numbers."
            )
        if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
            raise ValueError(
                f"{what}: {name} holds {int(y.size - np.count_nonzero(np.isfinite(y)))} NaN / Inf "
                "value(s)."
            )

    @property
    def adapt_pending(self):
        """Whether `adapt` still needs the training targets (BayesianModel.fit then calls it)."""
        return False

    def adapt(self, targets):
        """Fit data-dependent constants from the training targets: an array, or a tf.data.Dataset of
        target batches. Nothing to fit by default."""

    def check_output_shape(self, shape):
        raise NotImplementedError

    def log_prob(self, y, outputs):
        raise NotImplementedError

    def predictive_log_prob(self, y, outputs):
        """(batch,) log of the particle-averaged density: log (1/N) sum_n p(y | x, w_n)."""
        lp = self.log_prob(y, outputs)
        n = tf.cast(tf.shape(lp)[1], lp.dtype)
        return tf.reduce_logsumexp(lp, axis=1) - tf.math.log(n)

    def summary(self, outputs):
        raise NotImplementedError

    def predictive(self, outputs):
        raise NotImplementedError

    def uncertainty(self, outputs):
        raise NotImplementedError

    def accuracy_metric(self, name):
        """The metric "accuracy" / "acc" in compile(metrics=[...]) stands for (named `name`)."""
        raise ValueError(
            f"metrics=['{name}'] is not defined for the {type(self).__name__} likelihood; use a "
            "regression metric (e.g. keras.metrics.RootMeanSquaredError(), "
            "bayes_keras.metrics.IntervalCoverage())."
        )

    def predictive_interval(self, outputs, level):
        """(lower, upper), each (batch, d): the central `level` interval of the posterior predictive."""
        raise ValueError(
            f"Predictive intervals need a continuous likelihood (bayes_keras.likelihoods.Normal); "
            f"the model's likelihood is {type(self).__name__}."
        )

    def sampled_negative_log_likelihood(self, outputs, seed=None):
        """-log p(y~_bn | x_b, w_n), (batch, N), for labels y~_bn drawn from each particle's own predictive
        and held constant (gradients flow through `outputs` only): its gradient with respect to the
        pre-activations gives the true-Fisher statistics (Martens & Grosse 2015, Sec. 5).

        `seed`: a (2,) int tensor keying stateless draws (BayesianModel passes (its label seed, the
        optimizer's step), so a resumed run samples the labels an uninterrupted one would); None draws
        from TensorFlow's global generator."""
        raise ValueError(
            f"The true Fisher samples labels from the likelihood; {type(self).__name__} does not "
            "implement sampled_negative_log_likelihood. Use the empirical Fisher."
        )


def check_output_activation(output_layer, likelihood):
    """Refuse a softmax / sigmoid output under a likelihood that reads logits: the probabilities would be
    squashed twice (silently flat predictions)."""
    activation = getattr(output_layer, "activation", None)
    squashing = {keras.activations.softmax: "softmax", keras.activations.sigmoid: "sigmoid"}
    if likelihood.outputs_are_logits and activation in squashing:
        raise ValueError(
            f"The output layer '{output_layer.name}' applies {squashing[activation]}, but the {type(likelihood).__name__} "
            "likelihood reads the model's outputs as logits (it averages the particles' probabilities itself). "
            "Remove the output activation (e.g. Dense(10) instead of Dense(10, activation='softmax'))."
        )


def entropy_decomposition(probs):
    """Total entropy of the mean of `probs` (batch, N, K) = expected entropy + mutual information."""
    eps = 1e-12
    mean = tf.reduce_mean(probs, axis=1)
    total = -tf.reduce_sum(mean * tf.math.log(mean + eps), axis=-1)
    expected = tf.reduce_mean(-tf.reduce_sum(probs * tf.math.log(probs + eps), axis=-1), axis=1)
    return {
        "total_entropy": total,
        "expected_entropy": expected,
        "mutual_information": tf.maximum(total - expected, 0.0),
    }


LOG_2PI = math.log(2.0 * math.pi)


def shape_text(shape):
    """A tensor shape for an error message, also when its rank is unknown."""
    return "(unknown rank)" if shape.rank is None else str(tuple(shape))


def label_vector(y, message):
    """Labels (batch,) or (batch, 1) -> (batch,), checked as `target_matrix` checks one-column targets."""
    return target_matrix(y, 1, message, what="labels")[:, 0]


def target_matrix(y, width, message, what="targets"):
    """Targets (batch, width), or (batch,) when width is 1 -> (batch, width). A retraced step (Keras relaxes
    shapes when the data's shape changes between fits) may see an unknown rank or last axis; the check then
    runs on the values' shape."""
    if y.shape.rank == 1:
        y = y[:, None]
    if y.shape.rank is None or (y.shape.rank == 2 and y.shape[-1] is None):
        shape = tf.shape(y)
        with tf.control_dependencies(
            [tf.debugging.assert_equal(tf.size(y), shape[0] * width, message=message)]
        ):
            return tf.reshape(y, [-1, width])
    if y.shape.rank != 2 or y.shape[-1] != width:
        raise ValueError(f"{message}; got {what} of shape {shape_text(y.shape)}.")
    return y
