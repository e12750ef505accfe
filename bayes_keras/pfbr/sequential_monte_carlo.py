"""SequentialMonteCarlo: the particle filter PFBR is compared with."""

import weakref

import numpy as np
import tensorflow as tf

from bayes_keras.pfbr.problem import SequentialProblem


class SequentialMonteCarlo:
    """Sequential importance sampling with resampling at every observation, on the same problems and
    with the same `filter` call as ParticleFlowBayesRule.

    State-space problems (`problem.state_space`): the bootstrap filter (Gordon et al. 1993): propagate
    each particle through the transition, weight by the likelihood, resample. Static latents: the
    one-pass SMC of Balakrishnan & Madigan (2006, Bayesian Analysis 1(2)) in its usual form: weight by
    the new observation's likelihood, resample, then rejuvenate the duplicated particles with the
    Liu-West kernel x <- a x + (1 - a) mean + sqrt(1 - a^2) L eps (mean and L L^T those of the weighted
    particles before resampling, which the move preserves; `shrinkage` a, 0 turns rejuvenation off) so that repeated
    resampling does not collapse the particle set. Resampling is systematic.

    `filter` returns the equally weighted particles that the next stage starts from (after resampling
    and, for static latents, the move); `weighted=True` also returns each stage's weighted cloud before
    resampling, the filter's own estimate of the posterior: resampling only adds noise to it and leaves
    many copies of few particles, so compare it, scored as weighted (`kde_cross_entropy(..., weights=w)`,
    `weighted_moments`), with other methods.

    Example:

        smc = SequentialMonteCarlo()
        posteriors = smc.filter(problem, task, observations, num_particles=256)   # (L, B, N, d)
        _, cloud, weights = smc.filter(problem, task, observations, weighted=True)   # + (L, B, N, d), (L, B, N)
    """

    def __init__(self, shrinkage=0.98):
        if not 0 <= shrinkage < 1:
            raise ValueError(
                f"SequentialMonteCarlo: shrinkage must be in [0, 1); got {shrinkage!r}."
            )
        self.shrinkage = float(shrinkage)
        # problem -> its compiled step, kept across filter() calls
        self._steps = weakref.WeakKeyDictionary()

    def filter(
        self, problem, task, observations, particles=None, num_particles=256, seed=0, weighted=False
    ):
        """Filters `observations` (B, L, m, k) of the tasks `task` from `particles` (B, N, d) or N draws
        of the prior. Returns the particles after every stage (L, B, N, d); with `weighted=True` the tuple
        (particles, weighted_particles (L, B, N, d), weights (L, B, N)): each stage's importance-weighted
        cloud before resampling, weights normalised."""
        if not isinstance(problem, SequentialProblem):
            raise TypeError(
                f"SequentialMonteCarlo.filter: problem must be a bayes_keras.pfbr.SequentialProblem; "
                f"got {type(problem).__name__}."
            )
        task = problem.as_task_tensors(task)
        observations = tf.convert_to_tensor(observations, tf.float32)
        problem.check_observations(observations[:, 0])
        rng = np.random.default_rng(seed)
        if particles is None:
            particles, _ = problem.sample_prior(
                task, int(num_particles), rng.integers(0, 2**31 - 1, size=2)
            )
        particles = tf.convert_to_tensor(particles, tf.float32)
        step = self._step_function(problem)
        out, clouds, all_weights = [], [], []
        for n in range(observations.shape[1]):
            particles, cloud, weights = step(
                particles,
                observations[:, n],
                task,
                tf.constant(rng.integers(0, 2**31 - 1, size=(3, 2)), tf.int32),
            )
            out.append(particles.numpy())
            if weighted:
                clouds.append(cloud.numpy())
                all_weights.append(weights.numpy())
        if weighted:
            return np.stack(out), np.stack(clouds), np.stack(all_weights)
        return np.stack(out)

    def _step_function(self, problem):
        """The problem's compiled stage, traced once and reused by every filter() call (as PFBR's is)."""
        if problem not in self._steps:
            self._steps[problem] = self._compile_step(problem)
        return self._steps[problem]

    def _compile_step(self, problem):
        shrinkage = self.shrinkage

        @tf.function(reduce_retracing=True)
        def step(particles, observation, task, seeds):
            if problem.state_space:
                particles = problem.transition(particles, task, seeds[0])
            log_weights = problem.log_likelihood(particles, observation, task)
            weights = tf.nn.softmax(log_weights, axis=-1)
            resampled = systematic_resample(particles, log_weights, seeds[1])
            if problem.state_space or shrinkage == 0:
                return resampled, particles, weights
            # The kernel's spread comes from the weighted set before resampling: after a degenerate
            # resampling the copies' own covariance would be zero and the set could never spread again.
            mean = tf.reduce_sum(weights[..., None] * particles, axis=1, keepdims=True)
            centred = particles - mean
            covariance = tf.matmul(centred * weights[..., None], centred, transpose_a=True)
            return (
                liu_west_move(resampled, shrinkage, seeds[2], mean, covariance),
                particles,
                weights,
            )

        return step


def systematic_resample(particles, log_weights, seed):
    """Systematic resampling of (B, N, d) particles by (B, N) log weights: N equally weighted particles."""
    num = tf.shape(particles)[1]
    weights = tf.nn.softmax(tf.cast(log_weights, tf.float64), axis=-1)
    cumulative = tf.math.cumsum(weights, axis=-1)
    offset = tf.random.stateless_uniform([tf.shape(particles)[0], 1], seed, dtype=tf.float64)
    points = (tf.cast(tf.range(num), tf.float64)[None, :] + offset) / tf.cast(num, tf.float64)
    index = tf.minimum(tf.searchsorted(cumulative, points, side="right"), num - 1)
    return tf.gather(particles, index, batch_dims=1)


def liu_west_move(particles, shrinkage, seed, mean=None, covariance=None):
    """x <- a x + (1 - a) mean + sqrt(1 - a^2) chol(cov) eps per task (Liu & West 2001): keeps the mean
    and covariance of the set (by default the particles' own; SMC passes those of the weighted set
    before resampling) while separating the copies that resampling made."""
    if mean is None:
        mean = tf.reduce_mean(particles, axis=1, keepdims=True)
        centred = particles - mean
        n = tf.cast(tf.shape(particles)[1], particles.dtype)
        covariance = tf.matmul(centred, centred, transpose_a=True) / (n - 1.0)
    d = particles.shape[-1]
    chol = tf.linalg.cholesky(covariance + 1e-9 * tf.eye(d, dtype=particles.dtype))
    # A weighted set collapsed onto one particle has a covariance that rounding can leave slightly
    # indefinite, where the Cholesky factor is NaN and every particle became NaN. Those tasks use a square root
    # from the float64 eigendecomposition with negative eigenvalues clipped to 0 (any L with L L^T = C moves
    # the particles alike); the others keep their Cholesky factor bit for bit.
    symmetric = tf.cast(0.5 * (covariance + tf.linalg.matrix_transpose(covariance)), tf.float64)
    values, vectors = tf.linalg.eigh(
        tf.where(tf.math.is_finite(symmetric), symmetric, tf.zeros_like(symmetric))
    )
    root = tf.cast(vectors * tf.sqrt(tf.maximum(values, 0.0))[..., None, :], particles.dtype)
    factored = tf.reduce_all(tf.math.is_finite(chol), axis=[-2, -1], keepdims=True)
    chol = tf.where(factored, chol, root)
    noise = tf.random.stateless_normal(tf.shape(particles), seed, dtype=particles.dtype)
    return (
        shrinkage * particles
        + (1 - shrinkage) * mean
        + (1 - shrinkage**2) ** 0.5 * tf.matmul(noise, chol, transpose_b=True)
    )
