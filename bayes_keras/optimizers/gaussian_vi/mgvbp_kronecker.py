"""MGVBP with Kronecker-factored precisions (structure="kronecker"): per Dense / Conv layer, q over its
[kernel; bias] matrix (rows x columns, KFAC's view, row-major vec) with precision P = A (x) G.

An extension in the spirit of Noisy K-FAC (Zhang et al. 2018), not in the MGVBP paper (Magris, Shabani &
Iosifidis, "Manifold Gaussian Variational Bayes on the Precision Matrix", https://arxiv.org/abs/2210.14598),
whose retraction and momentum it uses. Read with `MGVBP` (mgvbp.py), the sampling base
(gaussian_variational_optimizer.py) and the manifold (precision_manifold.py). Per layer and step:

    the target: this batch's KFAC factors (A_hat, G_hat) (E_q by the mean over the samples), damped by each
        row's prior precision / T as the Kronecker product nearest A_hat (x) G_hat + D (x) I
                                                                  `kronecker_targets`, `damped_kronecker_factors`
    mean        m <- omega m + (1 - omega) P^-1 E[g] ;  mu <- mu + beta_mu m      `KroneckerGaussian.update`
    factors     A <- R_A(beta (A_hat - A)), G <- R_G(beta (G_hat - G)), then rebalanced (no momentum)
                                                                  `KroneckerGaussian.update`, `balance_factors`
    sampling    theta = mu + vec(L_A^-T E L_G^-1)                                  `sample_kronecker`
"""

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.curvature.kfac import candidate_specs, kfac_factors, split_damping
from bayes_keras.saving.loaded_state import check_positive_definite_entry
from bayes_keras.optimizers.gaussian_vi import precision_manifold as manifold
from bayes_keras.optimizers.gaussian_vi.gaussian_family import GaussianFamily, current
from bayes_keras.optimizers.gaussian_vi import mgvbp_update
from bayes_keras.optimizers.gaussian_vi.mgvbp import MGVBP
from bayes_keras.optimizers.gaussian_vi.mgvbp_update import prior_vectors

tfd = tfp.distributions
_LOG_2PI_E = math.log(2.0 * math.pi) + 1.0


# -- Kronecker-factored precision: P = A (x) G over a (p, q) weight matrix, row-major vec -----------
# (the structure="kronecker" blocks: Noisy-KFAC's family, Zhang et al. 2018, moved by MGVBP's
# retraction applied to each factor).
def balance_factors(a, g):
    """Rescale (A, G) -> (c A, G / c) so that both have the same mean eigenvalue; A (x) G is unchanged.
    Keeps the split of the product between the factors canonical, so that factor-wise updates of
    state and target pairs compare like with like."""
    p = tf.cast(tf.shape(a)[0], a.dtype)
    q = tf.cast(tf.shape(g)[0], g.dtype)
    c = tf.sqrt(
        tf.maximum(tf.linalg.trace(g) / q, 1e-300) / tf.maximum(tf.linalg.trace(a) / p, 1e-300)
    )
    return a * c, g / c


def damped_kronecker_factors(a, g, damping):
    """The Kronecker product X (x) Y nearest in Frobenius norm to A (x) G + D (x) I (Van Loan and Pitsianis
    1993), returned balanced: the precision that a Kronecker-factored posterior can hold closest to the
    KFAC curvature plus the prior precision. `damping` is a number (D = damping I) or a (p,) vector of
    each row's precision (D = diag(damping): a layer's kernel rows and its bias row have their own priors).

    Under the rearrangement R(X (x) Y) = vec(X) vec(Y)^T the target is vec(A) vec(G)^T + vec(D) vec(I_q)^T,
    of rank 2, so its best rank-1 approximation lies in span{A, D} x span{G, I}: X = s (alpha_1 A +
    alpha_2 D), Y = beta_1 G + beta_2 I, from the SVD of the 2 x 2 matrix L_u^T L_v (L_u, L_v Cholesky
    factors of the Gram matrices of {vec A, vec D} and {vec G, vec I}). Exact when a factor is 1 x 1 (or a
    multiple of I): then the target itself is a Kronecker product, e.g. (g A + D) (x) 1. KFAC's factored
    damping (A + pi sqrt(damping) I) (x) (G + sqrt(damping) / pi I) adds the positive cross terms
    sqrt(damping) (A / pi (x) I + pi I (x) G) and so over-states the precision (on conjugate regression it
    shrank the marginal sds to 0.89-0.92 of the exact posterior's and an unexcited weight's sd to a
    quarter); it remains the fallback (with D's mean as the damping) if the nearest product is not
    positive definite (not seen for PSD A, G)."""
    p, q = a.shape[-1], g.shape[-1]
    # a number is converted in a's dtype (not rounded through float32), a tensor cast
    lam = tf.cast(damping, a.dtype) if tf.is_tensor(damping) else tf.constant(damping, a.dtype)
    rows = tf.broadcast_to(lam, (p,))
    d = tf.linalg.diag(rows)
    eye_q = tf.eye(q, dtype=g.dtype)
    if q == 1:
        return balance_factors(g[0, 0] * a + d, tf.ones((1, 1), g.dtype))
    if p == 1:
        return balance_factors(tf.ones((1, 1), a.dtype), a[0, 0] * g + rows[0] * eye_q)

    def gram(m, n):
        k = tf.stack(
            [
                tf.stack([tf.reduce_sum(m * m), tf.reduce_sum(m * n)]),
                tf.stack([tf.reduce_sum(m * n), tf.reduce_sum(n * n)]),
            ]
        )
        # a relative ridge keeps the Cholesky defined when the factor is a multiple of the other (rank 1)
        return k + 1e-12 * tf.linalg.trace(k) * tf.eye(2, dtype=m.dtype)

    l_u, l_v = tf.linalg.cholesky(gram(a, d)), tf.linalg.cholesky(gram(g, eye_q))
    s, w, z = tf.linalg.svd(tf.matmul(l_u, l_v, transpose_a=True))
    alpha = tf.linalg.triangular_solve(l_u, w[:, :1], lower=True, adjoint=True)[:, 0]  # L_u^-T w
    beta = tf.linalg.triangular_solve(l_v, z[:, :1], lower=True, adjoint=True)[:, 0]
    # the pair's joint sign
    sign = tf.where(alpha[1] < 0, -tf.ones((), a.dtype), tf.ones((), a.dtype))
    alpha, beta = sign * alpha, sign * beta
    x = s[0] * (alpha[0] * a + alpha[1] * d)
    y = beta[0] * g + beta[1] * eye_q
    positive = tf.reduce_all(alpha >= 0) & tf.reduce_all(beta >= 0) & (alpha[1] > 0) & (beta[1] > 0)
    c_a, c_g = split_damping(a, g, tf.reduce_mean(rows))
    x = tf.where(positive, x, a + c_a * tf.eye(p, dtype=a.dtype))
    y = tf.where(positive, y, g + c_g * eye_q)
    return balance_factors(x, y)


def sample_kronecker(mean, chol_a, chol_g, eps):
    """theta = mu + vec(L_A^-T E L_G^-1) for eps (S, p*q): Cov = A^-1 (x) G^-1 = P^-1 (row-major vec)."""
    p, q = chol_a.shape[0], chol_g.shape[0]
    eye_p = tf.eye(p, dtype=chol_a.dtype)
    eye_q = tf.eye(q, dtype=chol_g.dtype)
    # L_A^-T
    left = tf.linalg.matrix_transpose(tf.linalg.triangular_solve(chol_a, eye_p, lower=True))
    right = tf.linalg.triangular_solve(chol_g, eye_q, lower=True)  # L_G^-1
    e = tf.reshape(eps, (-1, p, q))
    z = tf.einsum("ij,sjk,kl->sil", left, e, right)
    return mean[None, :] + tf.reshape(z, (-1, p * q))


def kronecker_solve(chol_a, chol_g, v):
    """P^-1 v = vec(A^-1 V G^-1) for v (p*q,) (V its row-major (p, q) matrix)."""
    p, q = chol_a.shape[0], chol_g.shape[0]
    x = tf.linalg.cholesky_solve(chol_a, tf.reshape(v, (p, q)))
    x = tf.linalg.matrix_transpose(tf.linalg.cholesky_solve(chol_g, tf.linalg.matrix_transpose(x)))
    return tf.reshape(x, (p * q,))


def entropy_kronecker(chol_a, chol_g):
    """Entropy of N(mu, (A (x) G)^-1): log det (A (x) G) = q log det A + p log det G."""
    p = tf.cast(chol_a.shape[0], chol_a.dtype)
    q = tf.cast(chol_g.shape[0], chol_g.dtype)
    logdet = 2.0 * (
        q * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol_a)))
        + p * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol_g)))
    )
    return -0.5 * logdet + 0.5 * p * q * _LOG_2PI_E


def kronecker_shapes(view, blocks, max_block_size):
    """Each block is one Dense / Conv2D layer's [kernel; bias] as a (p, q) matrix (KFAC's view)."""
    shapes = []
    for g in blocks:
        group = [view.variables[i] for i in g]
        names = ", ".join(v.path for v in group)
        try:
            spec = candidate_specs(group)[0]
        except ValueError as error:
            raise ValueError(
                f"MGVBP structure='kronecker' needs Dense, Conv1D or Conv2D particle layers; [{names}]: "
                f"{error} Use structure='diagonal' for this model."
            ) from None
        if not spec.kernel_and_bias:
            raise ValueError(
                f"MGVBP structure='kronecker' supports Dense, Conv1D and Conv2D particle layers; [{names}] "
                f"is a {spec.kind}. Use structure='diagonal' for this model."
            )
        if spec.variables != group:  # the flat block must be [kernel, bias], KFAC's row order
            raise ValueError(
                f"MGVBP structure='kronecker': expected the variables of [{names}] in the order "
                f"{[v.path for v in spec.variables]}."
            )
        p, q = spec.block_shape(spec.blocks[0])
        if max(p, q) > max_block_size:
            raise ValueError(
                f"MGVBP structure='kronecker' needs a {max(p, q)} x {max(p, q)} factor for "
                f"[{names}], above max_block_size={max_block_size}. Use "
                "structure='diagonal', or raise max_block_size."
            )
        shapes.append((p, q))
    return shapes


def kronecker_targets(view, blocks, kron_index, records, curvature, temperature, dtype):
    """Per block, the damped KFAC factors (A_hat, G_hat) that P moves toward: this batch's factors
    (dataset scale and temperature in G), E_q by the mean over the samples, with the prior precision
    / T of each row (kernel rows, bias row) as the damping D in A (x) G + D (x) I."""
    fisher = "true" if curvature == "fisher" else "empirical"
    targets = [None] * len(blocks)
    for r in records:
        j = kron_index.get(view.index(r.layer.kernel))
        if j is None:
            continue
        factors = kfac_factors(r, fisher)
        a = tf.reduce_mean(tf.cast(factors["A"], dtype), 0)
        g = tf.reduce_mean(tf.cast(factors["G"], dtype), 0)
        prior = prior_vectors(view, blocks[j], dtype, f"curvature='{curvature}'")[1] / tf.cast(
            temperature, dtype
        )
        # each row's prior precision: the block is [kernel rows; bias row] x outputs, flattened row-major
        rows = tf.reshape(prior, (a.shape[-1], g.shape[-1]))[:, 0]
        targets[j] = damped_kronecker_factors(a, g, rows)
    for j, t in enumerate(targets):
        if t is None:
            raise ValueError(
                f"MGVBP structure='kronecker': no curvature was captured for "
                f"{view.variables[blocks[j][0]].path}."
            )
    return targets


class KroneckerGaussian(GaussianFamily):
    """The row-major vec of a (rows, columns) weight matrix ([kernel; bias] of a Dense / Conv2D layer,
    KFAC's view) with precision P = A (x) G, A (rows x rows), G (columns x columns), in float64.

    The mean steps by the natural gradient P^-1 E[g] through the factors; each factor is retracted
    toward a target factor (MGVBP's retraction, halved when needed; no momentum on the factors), and the
    pair is rebalanced (A (x) G is unchanged by A c, G / c). An extension in the spirit of Noisy K-FAC
    (Zhang et al. 2018), not in the MGVBP paper.

    Further arguments:

    - rows, columns: the factors' sizes (dim = rows * columns).

    Args:
        dtype: the state's dtype.
        initial_precision: P = A (x) G at the start, times the identity (A = G = its square root times I).
        max_halvings: halvings tried per factor before its step is dropped.

    Example:
        >>> family = KroneckerGaussian(rows=65, columns=50, dtype="float64", initial_precision=1e3)
    """

    def __init__(self, rows, columns, dtype, initial_precision, max_halvings=5):
        super().__init__(rows * columns, dtype)
        self.rows, self.columns = int(rows), int(columns)
        self.initial_precision = float(initial_precision)
        self.max_halvings = int(max_halvings)

    def variables(self, add_variable, prefix):
        shapes = {
            "mean": (self.dim,),
            "m_mean": (self.dim,),
            "factor_a": (self.rows, self.rows),
            "factor_g": (self.columns, self.columns),
        }
        return {
            name: add_variable(shape, f"{prefix}_{name}", self.dtype)
            for name, shape in shapes.items()
        }

    def initialize(self, state, mean):
        state["mean"].assign(mean)
        root = np.sqrt(self.initial_precision)  # P = A (x) G = initial_precision I
        for name in ("factor_a", "factor_g"):
            state[name].assign(root * tf.eye(state[name].shape[0], dtype=self.dtype))

    def _cholesky(self, state, read=current):
        return tf.linalg.cholesky(read(state["factor_a"])), tf.linalg.cholesky(
            read(state["factor_g"])
        )

    def sample(self, state, eps, read=current):
        return sample_kronecker(read(state["mean"]), *self._cholesky(state, read), eps)

    def entropy(self, state):
        return entropy_kronecker(*self._cholesky(state))

    def _scales(self, state, rows=None):
        """Lower-triangular square roots of the row and column covariances A^-1, G^-1 (rows: a row range)."""
        cov_a, cov_g = (
            tf.linalg.inv(state["factor_a"].value),
            tf.linalg.inv(state["factor_g"].value),
        )
        if rows is not None:
            cov_a = cov_a[rows[0] : rows[1], rows[0] : rows[1]]
        return (
            tf.linalg.LinearOperatorLowerTriangular(tf.linalg.cholesky(cov_a)),
            tf.linalg.LinearOperatorLowerTriangular(tf.linalg.cholesky(cov_g)),
        )

    def distribution(self, state):  # row-major vec: Cov = A^-1 (x) G^-1
        return tfd.MultivariateNormalLinearOperator(
            state["mean"].value, tf.linalg.LinearOperatorKronecker(list(self._scales(state)))
        )

    def marginal(self, state, offset, size):
        rows = (offset // self.columns, (offset + size) // self.columns)  # a variable is whole rows
        return tfd.MultivariateNormalLinearOperator(
            state["mean"].value[offset : offset + size],
            tf.linalg.LinearOperatorKronecker(list(self._scales(state, rows))),
        )

    def update(
        self, state, mean_gradient, targets, learning_rate, mean_learning_rate, omega, writes
    ):
        """Mean: mu <- mu + beta_mu m, m <- omega m + (1 - omega) P^-1 E[g] with E[g] the mean gradient of the
        log joint (`mean_gradient`, (dim,)); factors: each retracted toward its target in `targets`
        = (A_hat, G_hat), then rebalanced."""
        old_a, old_g = state["factor_a"].value, state["factor_g"].value
        chol_a, chol_g = tf.linalg.cholesky(old_a), tf.linalg.cholesky(old_g)
        m_mu = self.momentum(state, "m_mean", kronecker_solve(chol_a, chol_g, mean_gradient), omega)
        new = []
        for old, chol, target in ((old_a, chol_a, targets[0]), (old_g, chol_g, targets[1])):
            retract = lambda p, xi, chol=chol: manifold.retract_full(p, xi, chol)  # noqa: E731
            xi = learning_rate * (target - old)
            # halving answers round-off, not NaN
            writes.require(tf.reduce_all(tf.math.is_finite(xi)))
            factor, _ = manifold.retract_with_halving(
                old, xi, retract, manifold.is_positive_definite_full, self.max_halvings
            )
            new.append(factor)
        new_a, new_g = balance_factors(*new)
        for name, value in (
            ("mean", state["mean"].value + mean_learning_rate * m_mu),
            ("m_mean", m_mu),
            ("factor_a", new_a),
            ("factor_g", new_g),
        ):
            writes.assign(state[name], value)


@keras.saving.register_keras_serializable(package="bayes_keras")
class MGVBPKronecker(MGVBP):
    """`MGVBP(structure="kronecker")`: one Kronecker-factored precision per Dense / Conv layer, moved toward
    the layers' captured KFAC factors (curvature "empirical_fisher" or "fisher"). Construct it as
    MGVBP(structure="kronecker", curvature=...); the arguments are MGVBP's."""

    structures = ("kronecker",)

    def _partition(self, view):
        return view.partition("layer")

    def check_structure(self, view):
        blocks = self._partition(view)
        self._kron_shapes = kronecker_shapes(view, blocks, self.max_block_size)
        self._kron_index = {
            g[0]: j for j, g in enumerate(blocks)
        }  # each layer's kernel -> its block

    def _family(self, j, dim):
        return KroneckerGaussian(
            *self._kron_shapes[j], self.posterior_dtype, self.initial_precision, self.max_halvings
        )

    def check_loaded_state(self):
        super().check_loaded_state()
        for block in self._state:
            for name in ("factor_a", "factor_g"):
                check_positive_definite_entry(
                    self.name, block[name], "optimizer", "a Kronecker factor"
                )

    def _update_blocks(self, thetas, grads, learning_rate, iteration, step, writes):
        """Per layer, the (N, D_b) gradients of the log joint (ascent) and the captured factors."""
        sizes = mgvbp_update.step_sizes(self, learning_rate, iteration)
        targets = kronecker_targets(
            self.view,
            self._blocks,
            self._kron_index,
            mgvbp_update.records(self, step),
            self.curvature,
            step.temperature,
            self.posterior_dtype,
        )
        for j, (grad, target) in enumerate(zip(grads, targets)):
            self._families[j].update(
                self._state[j], tf.reduce_mean(grad, axis=0), target, *sizes, writes
            )
