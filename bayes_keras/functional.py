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

from bayes_keras.core.bayesian_optimizer import BayesianOptimizer, StepInfo


@dataclasses.dataclass
class ParticleRun:
    """Result of `run_particles`: final particles (N, D), free energy trace, skipped steps, and (with
    `record_trajectory=True`) the particles before the first step and after every step
    (num_steps + 1, N, D)."""

    particles: np.ndarray
    free_energy: np.ndarray
    skipped_steps: int
    trajectory: np.ndarray = None

    @property
    def mean(self):
        return self.particles.mean(axis=0)

    @property
    def covariance(self):
        z = self.particles - self.mean
        return z.T @ z / self.particles.shape[0]


def run_particles(
    log_prob_fn, initial_particles, optimizer, num_steps, chunk=500, record_trajectory=False
):
    """Move particles with `optimizer` to fit the density exp(log_prob_fn).

    Args:
        log_prob_fn: maps an (N, D) float32 tensor to the (N,) unnormalised log densities.
        initial_particles: (N, D) array.
        optimizer: any `bayes_keras.optimizers.BayesianOptimizer` (e.g. GaussianParticleFlow).
        num_steps: number of updates.
        chunk: steps per compiled loop (the free energy is recorded at every step).
        record_trajectory: also return the particles after every step (`ParticleRun.trajectory`).

    An optimizer that needs the density itself (e.g. MatrixSVGD with a HessianPreconditioner, for
    the curvature at the particles) gets it through its `bind_log_prob(log_prob_fn)` when it has one.

    Returns:
        ParticleRun. A step whose gradient is not finite is skipped (counted, with a warning).

    Example:
        >>> run = run_particles(lambda x: -0.5 * tf.reduce_sum(x**2, 1), np.random.randn(3, 2),
        ...                     bayes_keras.optimizers.GaussianParticleFlow(0.1, step_rule="sgd"), 1000)
    """
    x0 = np.asarray(initial_particles, dtype=np.float32)
    if x0.ndim != 2:
        raise ValueError(f"initial_particles must be an (N, D) array; got shape {x0.shape}.")
    if not isinstance(optimizer, BayesianOptimizer):
        raise TypeError(
            f"run_particles needs a bayes_keras.optimizers.BayesianOptimizer; got {type(optimizer).__name__}."
        )
    x = keras.Variable(x0, name="particles")
    x.is_particle_variable = True
    optimizer.check_num_particles(x0.shape[0])
    optimizer.bind_log_prob(log_prob_fn)
    optimizer.build([x])
    skipped = keras.Variable(0, dtype="int32", trainable=False, name="skipped")

    def one_step():
        prepared = optimizer.prepare_step()
        with tf.GradientTape() as tape:
            lp = log_prob_fn(x.value)
            loss = -tf.reduce_sum(lp)
        g = tape.gradient(loss, x.value)
        step = StepInfo(
            log_likelihood=tf.stop_gradient(lp), log_prior=tf.zeros_like(lp), prepared=prepared
        )
        fe = optimizer.report(step).get("free_energy", -tf.reduce_mean(lp))
        finite = tf.reduce_all(tf.math.is_finite(g)) & tf.math.is_finite(loss)

        def apply():
            optimizer.apply([g], [x], step)
            return tf.constant(0)

        def skip():
            skipped.assign_add(1)
            return tf.constant(0)

        tf.cond(finite, apply, skip)
        return fe

    @tf.function
    def run_chunk(k):
        trace = tf.TensorArray(tf.float32, size=k)
        path = tf.TensorArray(tf.float32, size=k if record_trajectory else 0)
        for i in tf.range(k):
            trace = trace.write(i, tf.cast(one_step(), tf.float32))
            if record_trajectory:
                path = path.write(i, tf.cast(x.value, tf.float32))
        return trace.stack(), (path.stack() if record_trajectory else tf.zeros((0,)))

    traces, paths = [], [x0[None]]
    done = 0
    while done < num_steps:
        k = min(chunk, num_steps - done)
        trace, path = run_chunk(tf.constant(k))
        traces.append(trace.numpy())
        if record_trajectory:
            paths.append(path.numpy())
        done += k
    n_skipped = int(skipped.numpy())
    if n_skipped:
        warnings.warn(
            f"run_particles skipped {n_skipped} step(s) with non-finite gradients.", RuntimeWarning
        )
    refused = int(optimizer.skipped_updates.numpy())
    if refused:
        warnings.warn(
            f"run_particles: {optimizer.method_name} refused {refused} update(s) whose new particles or "
            "state were not finite (the step size is too large); they were left unchanged.",
            RuntimeWarning,
        )
    return ParticleRun(
        np.asarray(x.numpy()),
        np.concatenate(traces) if traces else np.zeros(0),
        n_skipped,
        np.concatenate(paths) if record_trajectory else None,
    )
