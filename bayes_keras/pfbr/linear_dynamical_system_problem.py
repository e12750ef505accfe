"""LinearDynamicalSystemProblem: filtering in a Gaussian linear dynamical system with random matrices."""

import math

import numpy as np
import tensorflow as tf

from bayes_keras.pfbr.problem import SequentialProblem


class LinearDynamicalSystemProblem(SequentialProblem):
    """x_0 ~ N(0, prior_std^2 I), x_n = A x_{n-1} + transition_std eps_n, o_n = B x_n + observation_std delta_n:
    the PFBR paper's hidden-Markov experiment (Chen, Dai & Song 2019, https://arxiv.org/abs/1902.00640,
    Section 5, Table 1), with the filtering posterior p(x_n | o_1..o_n) as the target and the Kalman
    filter (`exact_posterior`) as ground truth.

    Every task draws its own A and B, so an operator meta-trained here is evaluated on systems it has
    never seen; or pass `system=(A, B)` to fix one system for every task, as the paper's Table 1 does
    (`sample_system` draws one from the same distribution). Entries are standard normal, then A is scaled to spectral radius `transition_radius` and
    B multiplied by `observation_scale`: the authors' released 10-D system has entry standard deviations
    0.27 (A, spectral radius 0.99) and 0.23 (B), while unscaled N(0, 1) matrices make the state grow by
    about sqrt(d) per step (1e11 after 25 steps at d = 10), beyond float32 and any particle method.

    PFBR handles the latent's motion with the known transition (each particle draws its successor),
    then moves the propagated particles by Bayes' rule with the mixture
    (1/N) sum_j N(x; A x_{n-1}^j, transition_std^2 I) as their prior (the paper's LDS loss).

    Example:

        problem = LinearDynamicalSystemProblem(dim=10)
        task, observations = problem.sample_tasks(4, length=25, rng=np.random.default_rng(0))
        means, covariances = problem.exact_posterior(task, observations)
    """

    state_space = True

    def __init__(
        self,
        dim,
        transition_radius=0.99,
        observation_scale=0.25,
        prior_std=1.0,
        transition_std=1.0,
        observation_std=1.0,
        system=None,
    ):
        if int(dim) < 1:
            raise ValueError(
                f"LinearDynamicalSystemProblem: dim must be a positive integer; got {dim!r}."
            )
        for name, value in (
            ("transition_radius", transition_radius),
            ("observation_scale", observation_scale),
            ("prior_std", prior_std),
            ("transition_std", transition_std),
            ("observation_std", observation_std),
        ):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(
                    f"LinearDynamicalSystemProblem: {name} must be a positive number; got {value!r}."
                )
        self.latent_dim = self.observation_dim = int(dim)
        self.transition_radius = float(transition_radius)
        self.observation_scale = float(observation_scale)
        self.prior_std = float(prior_std)
        self.transition_std = float(transition_std)
        self.observation_std = float(observation_std)
        self.system = None
        if system is not None:
            if not (isinstance(system, (tuple, list)) and len(system) == 2):
                raise ValueError(
                    "LinearDynamicalSystemProblem: system must be a pair (A, B) of "
                    f"({dim}, {dim}) matrices; got {type(system).__name__}."
                )
            a, b = (np.asarray(m, np.float64) for m in system)
            if a.shape != (self.latent_dim,) * 2 or b.shape != (self.latent_dim,) * 2:
                raise ValueError(
                    f"LinearDynamicalSystemProblem: system must be a pair (A, B) of ({dim}, {dim}) "
                    f"matrices; got shapes {a.shape} and {b.shape}."
                )
            if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
                raise ValueError(
                    "LinearDynamicalSystemProblem: system (A, B) holds NaN or Inf entries."
                )
            self.system = (a, b)

    def sample_system(self, rng):
        """One (A, B) pair of the task distribution."""
        d = self.latent_dim
        a = rng.normal(size=(d, d))
        a *= self.transition_radius / np.max(np.abs(np.linalg.eigvals(a)))
        return a, self.observation_scale * rng.normal(size=(d, d))

    def sample_tasks(self, num_tasks, length, rng, system=None):
        """Tasks with fresh (A, B) each (or the given `system` = (A, B), else the problem's own fixed system,
        for all) and their observations."""
        d = self.latent_dim
        system = self.system if system is None else system
        systems = [self.sample_system(rng) if system is None else system for _ in range(num_tasks)]
        a = np.stack([s[0] for s in systems])
        b = np.stack([s[1] for s in systems])
        x = self.prior_std * rng.normal(size=(num_tasks, d))
        states, observations = [], []
        for _ in range(length):
            x = np.einsum("bij,bj->bi", a, x) + self.transition_std * rng.normal(
                size=(num_tasks, d)
            )
            states.append(x)
            observations.append(
                np.einsum("bij,bj->bi", b, x)
                + self.observation_std * rng.normal(size=(num_tasks, d))
            )
        task = {
            "transition": a.astype(np.float32),
            "observation": b.astype(np.float32),
            "states": np.stack(states, axis=1).astype(np.float32),
        }
        return task, np.stack(observations, axis=1)[:, :, None, :].astype(np.float32)

    def sample_prior(self, task, num_particles, seed):
        shape = [tf.shape(task["transition"])[0], num_particles, self.latent_dim]
        particles = self.prior_std * tf.random.stateless_normal(shape, seed)
        return particles, self.log_prior(particles, task)

    def log_prior(self, x, task):
        s = self.prior_std
        return -0.5 * tf.reduce_sum(tf.square(x / s), -1) - self.latent_dim * (
            math.log(s) + 0.5 * math.log(2 * math.pi)
        )

    def transition(self, x, task, seed):
        mean = tf.einsum("bnj,bij->bni", x, task["transition"])
        return mean + self.transition_std * tf.random.stateless_normal(
            tf.shape(x), seed, dtype=x.dtype
        )

    def log_transition_mixture(self, x_new, x_old, task):
        mean = tf.einsum("bnj,bij->bni", x_old, task["transition"])
        sq = (
            tf.reduce_sum(tf.square(x_new), -1)[:, :, None]
            + tf.reduce_sum(tf.square(mean), -1)[:, None, :]
            - 2.0 * tf.matmul(x_new, mean, transpose_b=True)
        )
        s = self.transition_std
        log_kernel = -0.5 * tf.maximum(sq, 0.0) / s**2 - self.latent_dim * (
            math.log(s) + 0.5 * math.log(2 * math.pi)
        )
        return tf.reduce_logsumexp(log_kernel, axis=-1) - tf.math.log(
            tf.cast(tf.shape(x_old)[1], x_new.dtype)
        )

    def log_likelihood_terms(self, x, observations, task):
        predicted = tf.einsum("bnj,bij->bni", x, task["observation"])
        sq = tf.reduce_sum(
            tf.square(observations[:, None, :, :] - predicted[:, :, None, :]), axis=-1
        )
        s = self.observation_std
        return -0.5 * sq / s**2 - self.observation_dim * (math.log(s) + 0.5 * math.log(2 * math.pi))

    def log_likelihood_hessian(self, x, observations, task):
        b = task["observation"]
        count = tf.cast(tf.shape(observations)[1], x.dtype)
        precision = count * tf.matmul(b, b, transpose_a=True) / self.observation_std**2
        return tf.zeros_like(x)[..., None] - precision[:, None, :, :]

    def exact_posterior(self, task, observations):
        """The Kalman filter's p(x_n | o_1..o_n) = N(mean_n, covariance_n) after every observation,
        float64: means (B, L, d), covariances (B, L, d, d)."""
        a = np.asarray(task["transition"], np.float64)
        b = np.asarray(task["observation"], np.float64)
        obs = np.asarray(observations, np.float64)[:, :, 0, :]
        num_tasks, length, d = obs.shape
        eye = np.eye(d)
        means, covariances = np.zeros((num_tasks, length, d)), np.zeros((num_tasks, length, d, d))
        for k in range(num_tasks):
            mean, cov = np.zeros(d), self.prior_std**2 * eye
            for n in range(length):
                mean = a[k] @ mean
                cov = a[k] @ cov @ a[k].T + self.transition_std**2 * eye
                innovation_cov = b[k] @ cov @ b[k].T + self.observation_std**2 * eye
                gain = np.linalg.solve(innovation_cov, b[k] @ cov).T
                mean = mean + gain @ (obs[k, n] - b[k] @ mean)
                cov = (eye - gain @ b[k]) @ cov
                cov = 0.5 * (cov + cov.T)
                means[k, n], covariances[k, n] = mean, cov
        return means, covariances

    def get_config(self):
        return {
            "dim": self.latent_dim,
            "transition_radius": self.transition_radius,
            "observation_scale": self.observation_scale,
            "prior_std": self.prior_std,
            "transition_std": self.transition_std,
            "observation_std": self.observation_std,
            "system": None if self.system is None else [m.tolist() for m in self.system],
        }
