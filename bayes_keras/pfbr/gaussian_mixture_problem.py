"""GaussianMixtureProblem: a two-component mixture likelihood whose posterior has two modes."""

import math

import numpy as np
import tensorflow as tf

from bayes_keras.pfbr.problem import SequentialProblem


class GaussianMixtureProblem(SequentialProblem):
    """x ~ N(0, prior_std^2 I_2), o_n | x ~ 1/2 N(x_1, s^2) + 1/2 N(x_1 + x_2, s^2): the PFBR paper's
    bimodal experiment (Chen, Dai & Song 2019, https://arxiv.org/abs/1902.00640, Section 5, after
    Welling & Teh 2011; the authors' code: prior_std 1, s = 1, 30-observation training sequences).

    (x_1, x_2) and (x_1 + x_2, -x_2) explain the data equally well, so the posterior keeps two modes:
    from data drawn at x* = (-1, 2), at (-1, 2) and (1, -2). `mode_masses` measures how much of a
    particle set (or of a grid posterior) sits nearer each.

    `truth_std` (default: prior_std) spreads the latents x* that `sample_tasks` draws for meta-training,
    separately from the model's prior: the modes are far apart only when |x*_2| is large, which a
    N(0, 1) draw gives rarely (|x*_2| >= 2 in 4.6% of tasks), so a wider spread shows the operator more
    of the strongly bimodal posteriors it meets at test time. The prior stays N(0, prior_std^2 I).

    Example:

        problem = GaussianMixtureProblem()
        task, observations = problem.sample_tasks(1, 30, np.random.default_rng(0), truth=(-1.0, 2.0))
    """

    latent_dim = 2
    observation_dim = 1

    def __init__(self, prior_std=1.0, observation_std=1.0, truth_std=None):
        truth_std = prior_std if truth_std is None else truth_std
        if not all(
            isinstance(v, (int, float, np.floating)) and np.isfinite(v) and v > 0
            for v in (prior_std, observation_std, truth_std)
        ):
            raise ValueError(
                f"GaussianMixtureProblem: prior_std, observation_std and truth_std must be positive "
                f"numbers; got {prior_std!r}, {observation_std!r}, {truth_std!r}."
            )
        self.prior_std = float(prior_std)
        self.observation_std = float(observation_std)
        self.truth_std = float(truth_std)

    def sample_tasks(self, num_tasks, length, rng, truth=None):
        """Tasks with latent x* ~ N(0, truth_std^2 I) (or `truth` for all) and their observations."""
        x = (
            rng.normal(size=(num_tasks, 2)) * self.truth_std
            if truth is None
            else np.tile(np.asarray(truth, np.float64), (num_tasks, 1))
        )
        second = rng.random(size=(num_tasks, length)) < 0.5
        means = x[:, None, 0] + second * x[:, None, 1]
        observations = means + self.observation_std * rng.normal(size=(num_tasks, length))
        return {"truth": x.astype(np.float32)}, observations[:, :, None, None].astype(np.float32)

    def sample_prior(self, task, num_particles, seed):
        shape = [tf.shape(task["truth"])[0], num_particles, 2]
        particles = self.prior_std * tf.random.stateless_normal(shape, seed)
        return particles, self.log_prior(particles, task)

    def log_prior(self, x, task):
        s = self.prior_std
        return -0.5 * tf.reduce_sum(tf.square(x / s), -1) - 2 * (
            math.log(s) + 0.5 * math.log(2 * math.pi)
        )

    def log_likelihood_terms(self, x, observations, task):
        o = observations[:, None, :, 0]
        first, both = x[..., 0:1], x[..., 0:1] + x[..., 1:2]
        s = self.observation_std
        log_components = tf.stack(
            [-0.5 * tf.square((o - first) / s), -0.5 * tf.square((o - both) / s)], axis=-1
        )
        return (
            tf.reduce_logsumexp(log_components, -1)
            - math.log(2.0)
            - math.log(s)
            - 0.5 * math.log(2 * math.pi)
        )

    @staticmethod
    def modes(truth):
        """The two posterior modes data from `truth` produce: x* and (x*_1 + x*_2, -x*_2)."""
        truth = np.asarray(truth, np.float64)
        return np.stack([truth, np.array([truth[0] + truth[1], -truth[1]])])

    @staticmethod
    def mode_masses(points, truth, weights=None):
        """The fraction of `points` (N, 2) (weighted by `weights`, e.g. grid probabilities) nearer each mode."""
        modes = GaussianMixtureProblem.modes(truth)
        nearer_first = np.linalg.norm(points - modes[0], axis=-1) <= np.linalg.norm(
            points - modes[1], axis=-1
        )
        weights = (
            np.full(len(points), 1.0 / len(points))
            if weights is None
            else np.asarray(weights) / np.sum(weights)
        )
        first = float(np.sum(weights * nearer_first))
        return first, 1.0 - first

    def get_config(self):
        return {
            "prior_std": self.prior_std,
            "observation_std": self.observation_std,
            "truth_std": self.truth_std,
        }
