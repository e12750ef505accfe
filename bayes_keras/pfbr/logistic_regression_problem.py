"""LogisticRegressionProblem: online Bayesian logistic regression over tasks made by rotating features."""

import math

import numpy as np
import tensorflow as tf

from bayes_keras.pfbr.problem import SequentialProblem


class LogisticRegressionProblem(SequentialProblem):
    """Bayesian logistic regression, y ~ Bernoulli(sigmoid(w . f + b)), w, b ~ N(0, prior_std^2), with
    labelled examples arriving in mini-batches of `batch_size` (one PFBR update per mini-batch: the
    paper's mini-batch embedding, Section 3.3).

    Tasks follow the PFBR paper's meta-learning experiment (Chen, Dai & Song 2019,
    https://arxiv.org/abs/1902.00640, Section 5, BLR-Meta): features `f` (e.g. PCA components, the
    leading ones first) are rotated in the plane of components `rotate` by an angle drawn uniformly
    from [-max_angle, max_angle] (the authors' script: 15 degrees), which moves the decision boundary,
    and each task sees its own random order of the examples. Observations are rows [f_rotated, y].

    Example:

        problem = LogisticRegressionProblem(features, labels, batch_size=16)
        task, observations = problem.sample_tasks(4, length=10, rng=np.random.default_rng(0))
        probability = problem.predictive_probability(particles[0], problem.rotated(test_features, task["angle"][0]))
    """

    def __init__(
        self,
        features,
        labels,
        batch_size=32,
        rotate=(0, 1),
        max_angle=math.radians(15),
        prior_std=1.0,
        fit_bias=True,
    ):
        features = np.asarray(features, np.float32)
        labels = np.asarray(labels, np.float32).reshape(-1)
        if features.ndim != 2 or len(features) != len(labels):
            raise ValueError(
                f"LogisticRegressionProblem: features must be (examples, features) with one label per "
                f"example; got features {features.shape}, labels {labels.shape}."
            )
        if not np.all((labels == 0) | (labels == 1)):
            raise ValueError("LogisticRegressionProblem: labels must be 0 or 1.")
        self.features, self.labels = features, labels
        self.batch_size = self.observations_per_update = int(batch_size)
        self.rotate = tuple(int(i) for i in rotate)
        self.max_angle = float(max_angle)
        self.prior_std = float(prior_std)
        self.fit_bias = bool(fit_bias)
        self.num_features = features.shape[1]
        self.latent_dim = self.num_features + int(self.fit_bias)
        self.observation_dim = self.num_features + 1

    def rotation(self, angle):
        """The (num_features x num_features) rotation by `angle` in the plane of components `rotate`."""
        i, j = self.rotate
        r = np.eye(self.num_features)
        r[i, i] = r[j, j] = math.cos(angle)
        r[i, j], r[j, i] = -math.sin(angle), math.sin(angle)
        return r

    def rotated(self, features, angle):
        return (np.asarray(features, np.float64) @ self.rotation(angle).T).astype(np.float32)

    def sample_tasks(self, num_tasks, length, rng, angle=None):
        """Tasks with an angle each (or `angle` for all) and `length` mini-batches drawn without
        replacement from the examples (with replacement once they run out)."""
        needed = length * self.batch_size
        angles = (
            rng.uniform(-self.max_angle, self.max_angle, size=num_tasks)
            if angle is None
            else np.full(num_tasks, angle)
        )
        observations = []
        for a in angles:
            order = rng.permutation(len(self.labels))
            while len(order) < needed:
                order = np.concatenate([order, rng.permutation(len(self.labels))])
            order = order[:needed]
            rows = np.concatenate(
                [self.rotated(self.features[order], a), self.labels[order, None]], axis=1
            )
            observations.append(rows.reshape(length, self.batch_size, -1))
        return {"angle": angles.astype(np.float32)}, np.stack(observations).astype(np.float32)

    def sample_prior(self, task, num_particles, seed):
        shape = [tf.shape(task["angle"])[0], num_particles, self.latent_dim]
        particles = self.prior_std * tf.random.stateless_normal(shape, seed)
        return particles, self.log_prior(particles, task)

    def log_prior(self, x, task):
        s = self.prior_std
        return -0.5 * tf.reduce_sum(tf.square(x / s), -1) - self.latent_dim * (
            math.log(s) + 0.5 * math.log(2 * math.pi)
        )

    def log_likelihood_terms(self, x, observations, task):
        return logistic_log_likelihood_terms(x, observations, self.fit_bias)

    def log_likelihood_hessian(self, x, observations, task):
        return logistic_log_likelihood_hessian(x, observations, self.fit_bias)

    def predictive_probability(self, particles, features, weights=None):
        """The posterior predictive P(y = 1 | f): the particles' mean sigmoid (weighted by `weights` (N,), an
        importance sampler's, if given). particles (N, latent_dim)."""
        particles = np.asarray(particles, np.float64)
        logits = np.asarray(features, np.float64) @ particles[:, : self.num_features].T
        if self.fit_bias:
            logits = logits + particles[:, -1]
        probabilities = 1.0 / (1.0 + np.exp(-logits))
        if weights is None:
            return probabilities.mean(axis=1)
        weights = np.asarray(weights, np.float64)
        if weights.shape != (particles.shape[0],) or not (
            np.all(weights >= 0) and weights.sum() > 0
        ):
            raise ValueError(
                f"LogisticRegressionProblem.predictive_probability: weights must be ({particles.shape[0]},) "
                f"non-negative, not all zero; got shape {weights.shape}."
            )
        return probabilities @ (weights / weights.sum())

    def get_config(self):
        return {
            "batch_size": self.batch_size,
            "rotate": self.rotate,
            "max_angle": self.max_angle,
            "prior_std": self.prior_std,
            "fit_bias": self.fit_bias,
        }


def _design(observations, fit_bias):
    features = observations[..., :-1]
    if fit_bias:
        features = tf.concat([features, tf.ones_like(features[..., :1])], axis=-1)
    return features, observations[..., -1]


def logistic_log_likelihood_terms(x, observations, fit_bias=True):
    """log Bernoulli(y | sigmoid(w . f + b)) for particles x = [w, b] (B, N, d) and rows [f, y] of
    observations (B, m, features + 1): (B, N, m)."""
    design, y = _design(observations, fit_bias)
    logits = tf.einsum("bnd,bmd->bnm", x, design)
    return y[:, None, :] * logits - tf.nn.softplus(logits)


def logistic_log_likelihood_hessian(x, observations, fit_bias=True):
    """-sum_k p_k (1 - p_k) f_k f_k^T per particle, the Hessian of the summed log likelihood: (B, N, d, d)."""
    design, _ = _design(observations, fit_bias)
    p = tf.sigmoid(tf.einsum("bnd,bmd->bnm", x, design))
    return -tf.einsum("bnm,bmi,bmj->bnij", p * (1.0 - p), design, design)
