"""GaussianMeanProblem: infer the mean of a multivariate Gaussian from noisy observations."""

import math

import numpy as np
import tensorflow as tf

from bayes_keras.pfbr.problem import SequentialProblem


class GaussianMeanProblem(SequentialProblem):
    """x ~ N(0, prior_std^2 I_d), o_n | x ~ N(x, observation_std^2 I_d): the conjugate model of the
    PFBR paper's first experiment (Chen, Dai & Song 2019, https://arxiv.org/abs/1902.00640, Section 5;
    the authors' code uses prior_std 1 and observation_std 3).

    Meta-training tasks start from the exact posterior after a random number of earlier observations
    (0 to `max_prefix`), so that the operator sees priors of every width a long test sequence reaches.
    `exact_posterior` gives the closed-form posterior after each observation for evaluation.

    Example:

        problem = GaussianMeanProblem(dim=2)
        task, observations = problem.sample_tasks(4, length=10, rng=np.random.default_rng(0))
    """

    def __init__(self, dim, prior_std=1.0, observation_std=3.0, max_prefix=100):
        if int(dim) < 1:
            raise ValueError(f"GaussianMeanProblem: dim must be a positive integer; got {dim!r}.")
        if not (prior_std > 0 and observation_std > 0):
            raise ValueError(
                f"GaussianMeanProblem: prior_std and observation_std must be positive; got "
                f"{prior_std!r}, {observation_std!r}."
            )
        self.latent_dim = self.observation_dim = int(dim)
        self.prior_std = float(prior_std)
        self.observation_std = float(observation_std)
        self.max_prefix = int(max_prefix)

    def sample_tasks(self, num_tasks, length, rng, prefix=None):
        """Tasks whose prior is the exact posterior after `prefix` earlier observations (drawn
        uniformly from 0..max_prefix per task when None) of the same latent x*."""
        d, s = self.latent_dim, self.observation_std
        truth = rng.normal(size=(num_tasks, d)) * self.prior_std
        counts = (
            rng.integers(0, self.max_prefix + 1, size=num_tasks)
            if prefix is None
            else np.full(num_tasks, prefix)
        )
        # The sum of k observations of x* is k x* + sqrt(k) s eps: one draw gives the prefix's statistic.
        sums = counts[:, None] * truth + np.sqrt(counts)[:, None] * s * rng.normal(
            size=(num_tasks, d)
        )
        precision = 1.0 / self.prior_std**2 + counts / s**2
        mean = sums / s**2 / precision[:, None]
        observations = truth[:, None, None, :] + s * rng.normal(size=(num_tasks, length, 1, d))
        task = {
            "prior_mean": mean.astype(np.float32),
            "prior_precision": precision.astype(np.float32),
            "truth": truth.astype(np.float32),
        }
        return task, observations.astype(np.float32)

    def sample_prior(self, task, num_particles, seed):
        mean, precision = task["prior_mean"], task["prior_precision"]
        noise = tf.random.stateless_normal(
            [tf.shape(mean)[0], num_particles, self.latent_dim], seed
        )
        particles = mean[:, None, :] + noise / tf.sqrt(precision)[:, None, None]
        return particles, self.log_prior(particles, task)

    def log_prior(self, x, task):
        mean, precision = task["prior_mean"], task["prior_precision"]
        sq = tf.reduce_sum(tf.square(x - mean[:, None, :]), axis=-1)
        return (
            0.5 * self.latent_dim * (tf.math.log(precision)[:, None] - math.log(2 * math.pi))
            - 0.5 * precision[:, None] * sq
        )

    def log_likelihood_terms(self, x, observations, task):
        s = self.observation_std
        sq = tf.reduce_sum(tf.square(observations[:, None, :, :] - x[:, :, None, :]), axis=-1)
        return -0.5 * sq / s**2 - self.latent_dim * (math.log(s) + 0.5 * math.log(2 * math.pi))

    def log_likelihood_hessian(self, x, observations, task):
        count = tf.cast(tf.shape(observations)[1], x.dtype)
        eye = tf.eye(self.latent_dim, dtype=x.dtype)
        return tf.zeros_like(x)[..., None] - count / self.observation_std**2 * eye

    def exact_posterior(self, task, observations):
        """Closed-form posteriors after each observation: means (B, L, d) and precisions (B, L) (the
        covariance is I / precision)."""
        obs = np.asarray(observations, np.float64)[:, :, 0, :]
        counts = np.arange(1, obs.shape[1] + 1)
        s2 = self.observation_std**2
        precision = np.asarray(task["prior_precision"], np.float64)[:, None] + counts[None, :] / s2
        info = (
            np.asarray(task["prior_mean"], np.float64)[:, None, :]
            * np.asarray(task["prior_precision"], np.float64)[:, None, None]
        )
        mean = (info + np.cumsum(obs, axis=1) / s2) / precision[:, :, None]
        return mean, precision

    def get_config(self):
        return {
            "dim": self.latent_dim,
            "prior_std": self.prior_std,
            "observation_std": self.observation_std,
            "max_prefix": self.max_prefix,
        }
