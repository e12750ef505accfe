"""OutputLayerFilter: online Bayesian updates of a model's logistic output layer by a PFBR operator."""

import numpy as np
import keras
import tensorflow as tf

from bayes_keras.layers.dense import Dense
from bayes_keras.pfbr.logistic_regression_problem import (
    LogisticRegressionProblem,
    logistic_log_likelihood_hessian,
    logistic_log_likelihood_terms,
)


class OutputLayerFilter:
    """Sequential Bayes updates of the particle posterior of a BayesianModel's output layer, a
    `bayes_keras.layers.Dense(1)` logistic head over features that every particle shares (a
    deterministic body, e.g. a pretrained feature extractor), by a meta-trained ParticleFlowBayesRule:
    each new labelled batch moves the head's N weight particles to the posterior that also conditions
    on it (Chen, Dai & Song 2019, https://arxiv.org/abs/1902.00640), with no re-optimisation and no
    stored past data. The model's predict / evaluate / export then use the updated particles.

    The operator's latent is the head's kernel and bias, (features + 1) numbers per particle. Meta-train
    it on the model's own features: `meta_training_problem(x, y)` builds the LogisticRegressionProblem
    (rotated-feature tasks, mini-batches of `batch_size`) for `ParticleFlowBayesRule.meta_fit`.

    Example:

        model = bk.BayesianModel(inputs, bk.layers.Dense(1, num_particles=64)(features), likelihood="bernoulli")
        head = bk.pfbr.OutputLayerFilter(model)
        operator = bk.pfbr.ParticleFlowBayesRule(latent_dim=head.latent_dim)
        operator.meta_fit(head.meta_training_problem(x_train, y_train, batch_size=16), iterations=300)
        head.reset()                              # particles from the prior N(0, prior_std^2)
        for x_batch, y_batch in stream:
            head.update(operator, x_batch, y_batch)
            probabilities = model.predict(x_test)  # the posterior predictive under the moved head
    """

    def __init__(self, model, prior_std=1.0):
        head = model.layers[-1] if model.layers else None
        if not isinstance(head, Dense) or head.units != 1 or head.deterministic:
            raise ValueError(
                "OutputLayerFilter: the model's last layer must be a bayes_keras.layers.Dense(1) with "
                f"particles (a logistic head); got {type(head).__name__ if head is not None else None}"
                + (
                    f" with units={head.units}, deterministic={head.deterministic}"
                    if isinstance(head, Dense)
                    else ""
                )
                + "."
            )
        if head.activation is not keras.activations.linear:
            raise ValueError(
                "OutputLayerFilter: the head must output logits (no activation); got activation "
                f"{getattr(head.activation, '__name__', head.activation)!r}."
            )
        feature_shape = head.input.shape
        if len(feature_shape) != 2:
            raise ValueError(
                "OutputLayerFilter: the head's input must be features shared by all particles, "
                f"(batch, features); got {tuple(feature_shape)}: the layers before it carry particles. "
                "Make them deterministic=True (or use a plain Keras feature extractor)."
            )
        self.model = model
        self.head = head
        self.prior_std = float(prior_std)
        self.num_features = int(feature_shape[-1])
        self.fit_bias = head.bias is not None
        self.latent_dim = self.num_features + int(self.fit_bias)
        # a tensor in, as model() takes
        inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
        self.feature_model = keras.Model(inputs, head.input)

    def features(self, x):
        """The shared features the head sees, (batch, features)."""
        return np.asarray(self.feature_model(x, training=False), np.float32)

    def meta_training_problem(self, x, y, batch_size=32, **kwargs):
        """A LogisticRegressionProblem over this model's features of (x, y), for meta-training the operator."""
        return LogisticRegressionProblem(
            self.features(x),
            y,
            batch_size=batch_size,
            prior_std=self.prior_std,
            fit_bias=self.fit_bias,
            **kwargs,
        )

    def particles(self):
        """The head's weight particles as (N, latent_dim): kernel columns, then the bias."""
        kernel = tf.reshape(self.head.kernel, [self.head.num_particles, self.num_features])
        if self.fit_bias:
            kernel = tf.concat([kernel, tf.reshape(self.head.bias, [-1, 1])], axis=1)
        return kernel.numpy()

    def set_particles(self, particles):
        particles = np.asarray(particles, np.float32)
        if particles.shape != (self.head.num_particles, self.latent_dim):
            raise ValueError(
                f"OutputLayerFilter: particles must have shape ({self.head.num_particles}, "
                f"{self.latent_dim}); got {particles.shape}."
            )
        self.head.kernel.assign(particles[:, : self.num_features, None])
        if self.fit_bias:
            self.head.bias.assign(particles[:, self.num_features :])

    def reset(self, seed=0):
        """Draws the head's particles from the prior N(0, prior_std^2 I) (the state before any data)."""
        rng = np.random.default_rng(seed)
        self.set_particles(
            self.prior_std * rng.normal(size=(self.head.num_particles, self.latent_dim))
        )

    def update(self, operator, x, y, seed=None):
        """Conditions the head's particles on one labelled batch (x, y) (y in {0, 1}) with `operator`."""
        if operator.latent_dim != self.latent_dim:
            raise ValueError(
                f"OutputLayerFilter.update: the operator's latent dimension is {operator.latent_dim}; "
                f"this head has {self.latent_dim} weights per particle."
            )
        features = self.features(x)
        if len(features) == 0:
            raise ValueError(
                "OutputLayerFilter.update: the batch holds no examples; an update needs at least one."
            )
        y = np.asarray(y, np.float32).reshape(-1)
        if len(y) != len(features):
            raise ValueError(
                f"OutputLayerFilter.update: y must hold one 0/1 label per example ({len(features)}); "
                f"got shape {np.shape(y)}."
            )
        if not np.all((y == 0) | (y == 1)):
            raise ValueError(
                f"OutputLayerFilter.update: y must hold 0/1 labels; got the values "
                f"{np.unique(y[(y != 0) & (y != 1)])[:5].tolist()}."
            )
        observations = tf.constant(np.concatenate([features, y[:, None]], axis=1)[None])
        fit_bias = self.fit_bias
        new, _ = operator.update(
            self.particles()[None],
            lambda w: tf.reduce_sum(logistic_log_likelihood_terms(w, observations, fit_bias), -1),
            seed=seed,
            log_likelihood_hessian=lambda w: logistic_log_likelihood_hessian(
                w, observations, fit_bias
            ),
        )
        self.set_particles(new.numpy()[0])
