"""The functional door: run a particle optimizer on any differentiable log density.

The same optimizer objects that train Keras models (bayes_keras.optimizers) move a plain (N, D)
particle matrix here, so the theorem tests, the toy targets and the references exercise the exact
code path of model.fit.
"""

import dataclasses
import warnings

import keras
import numpy as np
import tensorflow as tf


@dataclasses.dataclass
class ParticleRun:
    """Result of `run_particles`: final particles (N, D), free energy trace, skipped steps."""

    particles: np.ndarray
    free_energy: np.ndarray
    skipped_steps: int

    @property
    def mean(self):
        return self.particles.mean(axis=0)

    @property
    def covariance(self):
        z = self.particles - self.mean
        return z.T @ z / self.particles.shape[0]


def run_particles(log_prob_fn, initial_particles, optimizer, num_steps, chunk=500):
    """Move particles with `optimizer` to fit the density exp(log_prob_fn).

    Args:
        log_prob_fn: maps an (N, D) float32 tensor to the (N,) unnormalised log densities.
        initial_particles: (N, D) array.
        optimizer: a `bayes_keras.optimizers.ParticleOptimizer` (e.g. GaussianParticleFlow).
        num_steps: number of updates.
        chunk: steps per compiled loop (the free energy is recorded at every step).

    Returns:
        ParticleRun. A step whose gradient is not finite is skipped (counted, with a warning).

    Example:
        >>> run = run_particles(lambda x: -0.5 * tf.reduce_sum(x**2, 1), np.random.randn(3, 2),
        ...                     bayes_keras.optimizers.GaussianParticleFlow(0.1, step_rule="sgd"), 1000)
    """
    x0 = np.asarray(initial_particles, dtype=np.float32)
    if x0.ndim != 2:
        raise ValueError(f"initial_particles must be an (N, D) array; got shape {x0.shape}.")
    x = keras.Variable(x0, name="particles")
    x.is_particle_variable = True
    if hasattr(optimizer, "check_num_particles"):
        optimizer.check_num_particles(x0.shape[0])
    optimizer.build([x])
    skipped = keras.Variable(0, dtype="int32", trainable=False, name="skipped")
    has_entropy = hasattr(optimizer, "entropy")

    def one_step():
        with tf.GradientTape() as tape:
            lp = log_prob_fn(x.value)
            loss = -tf.reduce_sum(lp)
        g = tape.gradient(loss, x.value)
        fe = -tf.reduce_mean(lp) - (optimizer.entropy([x]) if has_entropy else 0.0)
        finite = tf.reduce_all(tf.math.is_finite(g)) & tf.math.is_finite(loss)

        def apply():
            optimizer.apply([g], [x])
            return tf.constant(0)

        def skip():
            skipped.assign_add(1)
            return tf.constant(0)

        tf.cond(finite, apply, skip)
        return fe

    @tf.function
    def run_chunk(k):
        trace = tf.TensorArray(tf.float32, size=k)
        for i in tf.range(k):
            trace = trace.write(i, tf.cast(one_step(), tf.float32))
        return trace.stack()

    traces = []
    done = 0
    while done < num_steps:
        k = min(chunk, num_steps - done)
        traces.append(run_chunk(tf.constant(k)).numpy())
        done += k
    n_skipped = int(skipped.numpy())
    if n_skipped:
        warnings.warn(f"run_particles skipped {n_skipped} step(s) with non-finite gradients.", RuntimeWarning)
    return ParticleRun(np.asarray(x.numpy()), np.concatenate(traces) if traces else np.zeros(0), n_skipped)
