"""SequentialProblem: the interface a family of sequential Bayesian inference tasks implements for PFBR."""

import numpy as np
import tensorflow as tf


class SequentialProblem:
    """A family of tasks (prior, likelihood, observation sequences) that a Particle Flow Bayes' Rule
    operator is meta-trained on and applied to (Chen, Dai & Song 2019, https://arxiv.org/abs/1902.00640,
    Section 3).

    A task is a dict of tensors with a leading task axis B (`sample_tasks` draws B of them with their
    observation sequences); particles are (B, N, latent_dim). Subclasses override:

    - `sample_tasks(num_tasks, length, rng)` -> (task, observations): task a dict of float32 numpy
      arrays with leading axis B; observations (B, length, observations_per_update, observation_dim).
    - `sample_prior(task, num_particles, seed)` -> (particles, log_density) of the task's prior.
    - `log_prior(x, task)` -> (B, N): the prior's log density (global latents).
    - `log_likelihood_terms(x, observations, task)` -> (B, N, m): log p(o_k | x) of each of the m
      observations (B, m, observation_dim) at each particle.

    State-space problems (`state_space = True`: the latent moves between observations, x_n ~
    p(x_n | x_{n-1})) also override `transition(x, task, seed)` (one draw per particle) and
    `log_transition_mixture(x_new, x_old, task)` = log (1/N) sum_j p(x_new_i | x_old_j), the predictive
    density that the particles x_old define; PFBR then moves the propagated particles by Bayes' rule
    with that mixture as the prior (the paper's Section 4 LDS loss).
    """

    state_space = False
    latent_dim = None
    observation_dim = None
    observations_per_update = 1

    def sample_tasks(self, num_tasks, length, rng):
        raise NotImplementedError

    def sample_prior(self, task, num_particles, seed):
        raise NotImplementedError

    def log_prior(self, x, task):
        raise NotImplementedError

    def log_likelihood_terms(self, x, observations, task):
        raise NotImplementedError

    def transition(self, x, task, seed):
        raise NotImplementedError(f"{type(self).__name__} is not a state-space problem.")

    def log_transition_mixture(self, x_new, x_old, task):
        raise NotImplementedError(f"{type(self).__name__} is not a state-space problem.")

    def log_likelihood_hessian(self, x, observations, task):
        """Hessian of log_likelihood in x, (B, N, d, d): what the exact divergence of PFBR's flow needs.
        Automatic differentiation here; problems with a closed form override it."""
        return autodiff_hessian(lambda z: self.log_likelihood(z, observations, task), x)

    def log_likelihood(self, x, observations, task, mask=None):
        """sum_k mask_k log p(o_k | x): (B, N). observations (B, m, observation_dim); mask (B, m) or None."""
        terms = self.log_likelihood_terms(x, observations, task)
        if mask is not None:
            terms = terms * tf.cast(mask, terms.dtype)[:, None, :]
        return tf.reduce_sum(terms, axis=-1)

    def check_observations(self, observations):
        """observations as float32 (B, m, observation_dim), or a ValueError naming the expected shape."""
        observations = tf.convert_to_tensor(observations, tf.float32)
        shape = observations.shape
        if shape.rank != 3 or (
            self.observation_dim is not None and shape[-1] != self.observation_dim
        ):
            raise ValueError(
                f"{type(self).__name__}: observations must have shape (tasks, observations_per_update, "
                f"{self.observation_dim}); got {tuple(shape)}."
            )
        return observations

    def get_config(self):
        return {}

    @staticmethod
    def as_task_tensors(task):
        return {
            key: tf.convert_to_tensor(np.asarray(value), tf.float32) for key, value in task.items()
        }


def autodiff_hessian(log_likelihood, x):
    """The Hessian of sum(log_likelihood(x)) in each particle's coordinates, (B, N, d) -> (B, N, d, d),
    by automatic differentiation (d reverse passes, vectorised)."""
    shape = tf.shape(x)
    rows = tf.reshape(x, [-1, x.shape[-1]])
    with tf.GradientTape() as outer:
        outer.watch(rows)
        with tf.GradientTape() as inner:
            inner.watch(rows)
            value = tf.reduce_sum(log_likelihood(tf.reshape(rows, shape)))
        gradient = inner.gradient(value, rows)
    hessian = outer.batch_jacobian(gradient, rows)
    return tf.reshape(hessian, tf.concat([shape, shape[-1:]], axis=0))
