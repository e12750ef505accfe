"""Exact posteriors of 2-D static problems on a grid: the ground truth where no closed form exists."""

import numpy as np
import tensorflow as tf


def grid_posterior(problem, task, observations, lower=-4.0, upper=4.0, size=200):
    """p(x | o_1..o_n) on a size x size grid over [lower, upper]^2 after every observation, for a 2-D
    static `problem` (prior times likelihoods, normalised on the grid).

    Returns (points (size^2, 2), probabilities (B, L, size^2)), each step's probabilities summing to 1.
    """
    if problem.latent_dim != 2 or problem.state_space:
        raise ValueError(
            f"grid_posterior needs a 2-D static problem; got latent_dim={problem.latent_dim}, "
            f"state_space={problem.state_space}."
        )
    axis = np.linspace(lower, upper, size)
    points = np.stack(np.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)
    task = problem.as_task_tensors(task)
    observations = tf.convert_to_tensor(observations, tf.float32)
    num_tasks = observations.shape[0]
    x = tf.constant(np.broadcast_to(points, (num_tasks,) + points.shape), tf.float32)
    log_p = tf.cast(problem.log_prior(x, task), tf.float64)
    out = []
    for n in range(observations.shape[1]):
        log_p += tf.cast(problem.log_likelihood(x, observations[:, n], task), tf.float64)
        out.append(tf.nn.softmax(log_p, axis=-1).numpy())
    return points, np.stack(out, axis=1)
