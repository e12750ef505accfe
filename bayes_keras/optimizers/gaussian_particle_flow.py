"""Gaussian particle flow (Galy-Fajou, Perrone & Opper, "Flexible and Efficient Inference with Particles
for the Variational Gaussian Approximation", Entropy 23(8), 990, 2021, https://doi.org/10.3390/e23080990).

Particles x_i (i = 1..N), phi = -log p(y, x), g_i = grad phi(x_i), m = mean_i x_i, z_i = x_i - m. The
functions take lists of (N, d_v) tensors, one per variable, so nothing is concatenated. The paper's
equations map to:

    flow (Eq. 13)     x_i <- x_i - eta Delta_i,  Delta_i = g_bar + (1/N) sum_j (z_j . z_i) g_j - z_i,
                      computed as Delta = ((K + 1 1^T) / N) G - Z with the N x N Gram K = Z Z^T (the
                      D x D matrix A = I - E[g z^T] is never formed: O(N^2 D))      `gpf_direction`
    structured mean field (Sec. 3.5): "layer": A block-diagonal, one Gram per block; "mean_field": A
                      diagonal, Delta_i = g_bar + z_i * (diag E[g z^T] - 1)       `_structure_blocks`
    free energy       F = E_q[phi] - H(q), q = N(m, Z^T Z / N) on the particles' span
                                                      `gaussian_entropy`, `GaussianParticleFlow.report`
    dimension-wise optimizers (App. H)          `step_rules.DimWiseAdam`, `step_rules.DimWiseRMSProp`
"""

import math
import warnings
from typing import NamedTuple, Optional

import keras
import numpy as np
import tensorflow as tf

from bayes_keras.core import step_rules
from bayes_keras.core.particle_optimizer import ParticleOptimizer
from bayes_keras.core.particle_view import merged

_LOG_2PI_E = math.log(2.0 * math.pi) + 1.0


def _centre(xs):
    return [x - tf.reduce_mean(x, axis=0, keepdims=True) for x in xs]


def _gram(zs):
    """K = sum_v Z_v Z_v^T, the N x N Gram of a block given as its variables' (N, d_v) pieces."""
    return tf.add_n([tf.matmul(z, z, transpose_b=True) for z in zs])


class ParticleCloud(NamedTuple):
    """What both the flow's direction and the entropy of the particles' Gaussian are built from:
    the particles, their centred values Z_v and one N x N Gram K = Z Z^T per block (None for
    "mean_field"). Computed once per step (GaussianParticleFlow.prepare_step) and handed to both."""

    particles: list
    centred: list
    grams: Optional[list]


def particle_cloud(particles, blocks):
    """The `ParticleCloud` of (N, d_v) particle tensors under `blocks` (as in `gpf_direction`)."""
    zs = _centre(particles)
    grams = None if blocks == "mean_field" else [_gram([zs[v] for v in block]) for block in blocks]
    return ParticleCloud(list(particles), zs, grams)


def _concat(xs, idx):
    return xs[idx[0]] if len(idx) == 1 else tf.concat([xs[i] for i in idx], axis=1)


def gpf_direction(particles, grads, blocks, mean_preconditioning=False, cloud=None):
    """The GPF pseudo-gradient Delta for every particle (the update is x <- x - step(Delta)).

    Args:
        particles: list of (N, d_v) tensors (flattened particle variables).
        grads: list of (N, d_v) gradients of the NEGATIVE log joint at those particles.
        blocks: "mean_field", or a list of lists of indices into `particles`: each inner list is
            one block of the block-diagonal flow ([[0, 1, ..., V-1]] is the full flow).
        mean_preconditioning: replace the mean drift g_bar by C g_bar (C the particles' covariance
            in the block), which makes the mean's convergence independent of the conditioning once
            C approaches the posterior covariance (a natural gradient on the mean only).
        cloud: the `particle_cloud(particles, blocks)` if already computed (it is then not redone).

    Returns:
        list of (N, d_v) tensors Delta_v.
    """
    cloud = particle_cloud(particles, blocks) if cloud is None else cloud
    zs = cloud.centred
    n = tf.cast(tf.shape(particles[0])[0], particles[0].dtype)
    if blocks == "mean_field":
        out = []
        for z, g in zip(zs, grads):
            gbar = tf.reduce_mean(g, axis=0, keepdims=True)
            if mean_preconditioning:
                gbar = tf.reduce_mean(z * z, axis=0, keepdims=True) * gbar
            psi = tf.reduce_mean(g * z, axis=0, keepdims=True)  # diagonal of E[g z^T]
            out.append(gbar + z * (psi - 1.0))  # psi and gbar have no particle axis
        return out
    out = [None] * len(particles)
    for block, gram in zip(blocks, cloud.grams):  # gram: (N, N)
        if not mean_preconditioning:
            # 1 g_bar^T = (1/N) 1 1^T G, so Delta = ((K + 1 1^T) / N) G - Z (`gram + 1.0` adds the all-ones
            # matrix): one matmul by an N x N matrix and one subtraction per variable.
            mixing = (gram + 1.0) / n
            for v in block:
                out[v] = tf.matmul(mixing, grads[v]) - zs[v]
            continue
        # C g_bar = (1/N) Z^T (Z g_bar), per block.
        gbars = {v: tf.reduce_mean(grads[v], axis=0, keepdims=True) for v in block}
        s = tf.add_n([tf.matmul(zs[v], gbars[v], transpose_b=True) for v in block])  # (N, 1)
        for v in block:
            gbar = tf.matmul(s, zs[v], transpose_a=True) / n
            out[v] = gbar + tf.matmul(gram, grads[v]) / n - zs[v]
    return out


def gaussian_entropy(particles, blocks, cloud=None):
    """Entropy of the Gaussian N(m, C) defined by the particles, C = Z^T Z / N, in its support.

    With N <= D the covariance is singular (rank N - 1); the entropy is that of the Gaussian on the
    particles' affine span, from the nonzero eigenvalues of the N x N matrix K / N (the same as
    those of C; with N > D the D x D covariance is used instead). Block structures sum their blocks'
    entropies (q factorises over blocks). `cloud`: the `particle_cloud(particles, blocks)` if already
    computed (its centred values and Grams are then reused).
    """
    cloud = particle_cloud(particles, blocks) if cloud is None else cloud
    n_int = particles[0].shape[0]
    n = tf.cast(tf.shape(particles[0])[0], particles[0].dtype)
    if blocks == "mean_field":
        total = 0.0
        for z in cloud.centred:
            var = tf.reduce_mean(z * z, axis=0)
            total += 0.5 * tf.reduce_sum(tf.math.log(tf.maximum(var, 1e-30)) + _LOG_2PI_E)
        return total
    total = 0.0
    for block, particle_gram in zip(blocks, cloud.grams):
        dim = sum(int(particles[v].shape[1]) for v in block)
        rank = min(n_int - 1, dim)
        # The nonzero eigenvalues of K / N = Z Z^T / N and C = Z^T Z / N coincide: use the smaller.
        small = dim < n_int
        size = dim if small else n_int

        def log_det(dtype):
            if small:
                z = (
                    _concat(cloud.centred, block)
                    if dtype == particles[0].dtype
                    else _centre([tf.cast(_concat(particles, block), dtype)])[0]
                )
                gram = tf.matmul(z, z, transpose_a=True)
            elif dtype == particles[0].dtype:
                gram = particle_gram  # the direction's K, not recomputed
            else:
                # K = sum_v Z_v Z_v^T block by block: concatenating the block first copied every weight.
                gram = _gram(_centre([tf.cast(particles[v], dtype) for v in block]))
            gram = tf.cast(gram, tf.float64) / tf.cast(n, tf.float64)
            finite = tf.reduce_all(tf.math.is_finite(gram))
            # eigvalsh in float64: float32 eigensolvers fail to converge on the near-singular Grams of
            # tight clouds. A diverged (non-finite) cloud gives NaN, not an eigensolver error.
            eig = tf.linalg.eigvalsh(tf.where(finite, gram, tf.eye(size, dtype=tf.float64)))[-rank:]
            value = tf.reduce_sum(tf.math.log(tf.maximum(eig, 1e-300)))
            return tf.where(finite, value, tf.constant(float("nan"), tf.float64)), eig

        # The Gram in the particles' dtype resolves eigenvalues down to ~eps * lambda_max; a cloud whose
        # spreads differ by more (1e5 along rotated axes: the log-determinant fell to the 1e-300 floor,
        # free energy -360 instead of -23) is redone in float64, several times costlier on CPU (this runs every
        # step for the free-energy metric), so only then.
        logdet, eig = log_det(particles[0].dtype)
        if particles[0].dtype != tf.float64:
            resolution = 1e3 * np.finfo(particles[0].dtype.as_numpy_dtype).eps
            coarse = eig[0] <= resolution * eig[-1]
            logdet = tf.cond(coarse, lambda: log_det(tf.float64)[0], lambda: logdet)
        logdet = tf.cast(logdet, particles[0].dtype)
        total += 0.5 * logdet + 0.5 * rank * _LOG_2PI_E
    return total


_STRUCTURES = ("full", "layer", "mean_field")


class _Prepared(NamedTuple):
    """GaussianParticleFlow.prepare_step's value (`StepInfo.prepared`)."""

    cloud: ParticleCloud
    entropy: tf.Tensor


@keras.saving.register_keras_serializable(package="bayes_keras")
class GaussianParticleFlow(ParticleOptimizer):
    """Gaussian particle flow: N particles follow the linear flow that minimises the free energy of the
    Gaussian N(mean, covariance) they define (Galy-Fajou et al. 2021, https://doi.org/10.3390/e23080990;
    its equations and the functions implementing them: this module's docstring). With D + 1 particles a
    Gaussian target is recovered exactly. The free energy (negative ELBO of that Gaussian) per training
    example is reported as the metric "free_energy".

    Args:
        learning_rate: step size (the paper's BNNs: 1e-2 with dimension-wise RMSProp).
        structure: "full" (one flow over all weights: a rank N-1 Gaussian), "layer" (block-diagonal,
            one block per layer, its kernel and bias together: "GPF (Layers)", best on the paper's MNIST
            net), or "mean_field".
        step_rule: "adam" (dimension-wise Adam, the default), "rmsprop" (dimension-wise RMSProp, the
            paper's BNN setting), "sgd", "signal_rmsprop" (RMSProp's step scaled by the share of the
            direction that persists between steps), or a StepRule. A dimension-wise rule (one second
            moment per coordinate, shared by the particles) keeps the flow affine; an element-wise one
            would not. On a full batch Adam's particles settle at the flow's fixed point, constant-rate
            RMSProp's keep jittering around it (docs/gpf_finite_n.md).
        mean_preconditioning: precondition the mean drift by the particle covariance.
        shared_learning_rate: Adam step size for deterministic (shared) weights.

    Example:
        >>> model.compile(optimizer=bayes_keras.optimizers.GaussianParticleFlow(1e-2, structure="layer"))
    """

    pairwise_tensors = 3  # the N x N coupling of the particles (benchmarks/size_guard_peaks.py)

    reported_metrics = ("free_energy",)

    def __init__(
        self,
        learning_rate=1e-2,
        structure="full",
        step_rule="adam",
        mean_preconditioning=False,
        **kwargs,
    ):
        if structure not in _STRUCTURES:
            raise ValueError(
                f"GaussianParticleFlow structure must be one of {_STRUCTURES}; got {structure!r}."
            )
        super().__init__(learning_rate=learning_rate, step_rule=step_rule, **kwargs)
        if type(self.step_rule) is step_rules.ElementwiseAdam:
            warnings.warn(
                "GaussianParticleFlow with an element-wise step rule (ElementwiseAdam) preconditions every "
                "particle differently, so the flow is no longer affine and the particles no longer follow "
                "the Gaussian's flow; use a dimension-wise rule ('adam', 'rmsprop') or 'sgd'.",
                UserWarning,
                stacklevel=2,
            )
        self.structure = structure
        self.mean_preconditioning = bool(mean_preconditioning)

    def check_particles(self):
        """Warns for every particle variable whose particles are all equal (called by fit as training starts;
        not at build, which loading and cloning do before the weights are set)."""
        if not tf.executing_eagerly():
            return
        for v in self.view.variables:
            flat = tf.reshape(v.value, (v.shape[0], -1))  # compared on device: one bool comes back
            if v.shape[0] > 1 and bool(tf.reduce_all(tf.equal(flat, flat[:1]))):
                warnings.warn(
                    f"GaussianParticleFlow: all particles of {v.path} are identical. The flow is affine, so "
                    "particles equal along a coordinate stay equal there (a rank-deficient Gaussian); "
                    "initialise with spread (e.g. model.initialize_particles(center, noise_std)).",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def _structure_blocks(self, blocks):
        if self.structure == "mean_field":
            return "mean_field"
        if self.structure == "full":
            return merged(blocks)
        return blocks

    def direction(self, particles, grads, blocks, cloud=None):
        """GPF's flow direction for the particles and the gradients of the negative log joint (lists of
        (N, d_v) tensors) over the view's layer blocks; `cloud`: the particles' `ParticleCloud` if already
        computed (`prepare_step`)."""
        return gpf_direction(
            particles, grads, self._structure_blocks(blocks), self.mean_preconditioning, cloud
        )

    def prepare_step(self):
        """The particles' `ParticleCloud` (centred values, Grams) and the entropy of their Gaussian: neither
        depends on the step's gradients, so they are computed beside the forward and backward passes, and
        the direction reuses the Grams."""
        if not self.built:
            return None
        cloud = self._cloud()
        return _Prepared(cloud, self.entropy(cloud))

    def _cloud(self):
        flat = self.view.flat_particles()
        return particle_cloud(flat, self._structure_blocks(self.view.layer_blocks))

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        prepared = None if step is None else step.prepared
        cloud = self._cloud() if prepared is None else prepared.cloud
        directions = self.direction(
            cloud.particles, self.view.flat_gradients(grads), self.view.layer_blocks, cloud
        )
        self.step_particles(directions, learning_rate, iteration, writes)

    def entropy(self, cloud=None):
        """Entropy of the Gaussian defined by the current particles, under this structure (`cloud`: their
        `ParticleCloud` if already computed)."""
        cloud = self._cloud() if cloud is None else cloud
        blocks = self._structure_blocks(self.view.layer_blocks)
        return gaussian_entropy(cloud.particles, blocks, cloud)

    def report(self, step):
        """The free energy (negative ELBO of the particles' Gaussian) per training example."""
        log_joint = step.log_joint
        entropy = self.entropy() if step.prepared is None else step.prepared.entropy
        return {
            "free_energy": (-tf.reduce_mean(log_joint) - tf.cast(entropy, log_joint.dtype))
            / step.dataset_size
        }

    def check_num_particles(self, num_particles):
        if num_particles < 2:
            raise ValueError(
                f"GaussianParticleFlow needs at least 2 particles to define a covariance; the model has "
                f"num_particles={num_particles}."
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {"structure": self.structure, "mean_preconditioning": self.mean_preconditioning}
        )
        return config
