"""KroneckerGaussian: q over a layer's (p, q) weight matrix with precision A (x) G."""

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.optimizers.gaussian_vi import natural_gradients as ng
from bayes_keras.optimizers.gaussian_vi.gaussian_family import GaussianFamily, current

tfd = tfp.distributions


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
        return ng.sample_kronecker(read(state["mean"]), *self._cholesky(state, read), eps)

    def entropy(self, state):
        return ng.entropy_kronecker(*self._cholesky(state))

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

    def step(self, state, mean_gradient, targets, learning_rate, mean_learning_rate, omega, writes):
        """Mean: mu <- mu + beta_mu m, m <- omega m + (1 - omega) P^-1 E[g] with E[g] the mean gradient of the
        log joint (`mean_gradient`, (dim,)); factors: each retracted toward its target in `targets`
        = (A_hat, G_hat), then rebalanced."""
        old_a, old_g = state["factor_a"].value, state["factor_g"].value
        chol_a, chol_g = tf.linalg.cholesky(old_a), tf.linalg.cholesky(old_g)
        m_mu = self.momentum(
            state, "m_mean", ng.kronecker_solve(chol_a, chol_g, mean_gradient), omega
        )
        new = []
        for old, chol, target in ((old_a, chol_a, targets[0]), (old_g, chol_g, targets[1])):
            retract = lambda p, xi, chol=chol: ng.retract_full(p, xi, chol)  # noqa: E731
            xi = learning_rate * (target - old)
            writes.require(
                tf.reduce_all(tf.math.is_finite(xi))
            )  # halving answers round-off, not NaN
            factor, _ = ng.retract_with_halving(
                old, xi, retract, ng.is_positive_definite_full, self.max_halvings
            )
            new.append(factor)
        new_a, new_g = ng.balance_factors(*new)
        for name, value in (
            ("mean", state["mean"].value + mean_learning_rate * m_mu),
            ("m_mean", m_mu),
            ("factor_a", new_a),
            ("factor_g", new_g),
        ):
            writes.assign(state[name], value)
