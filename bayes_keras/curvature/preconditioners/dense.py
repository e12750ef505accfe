"""Dense per-particle curvature from a function of the particles (the functional door's preconditioners)."""

import keras
import numpy as np
import tensorflow as tf

from bayes_keras._config import check_number
from bayes_keras.curvature.preconditioners.base import Preconditioner
from bayes_keras.curvature.preconditioners.curvature import Curvature

_RULES = ("clip", "abs")


def regularize_curvature(
    h, min_eigenvalue=1e-2, damping=0.0, eigenvalue_rule="clip", shrinkage=0.5
):
    """Raw per-particle curvatures (N, D, D) -> a DenseCurvature (never inverts a raw Hessian).

    Q_l = U diag(r(lambda) + damping) U^T with H_l = U diag(lambda) U^T (symmetrised) and
    r(lambda) = max(lambda, min_eigenvalue) ("clip") or max(|lambda|, min_eigenvalue) ("abs", the
    saddle-free choice); then Q_l <- (1 - shrinkage) Q_l + shrinkage Q_bar (the authors' toy code
    mixes each Hessian with the average, shrinkage 0.5, "for robustness"). Q_bar = mean_l Q_l (Eq. 15).
    A non-finite H marks the curvature not finite (the optimizer skips the step) and is replaced by
    the identity so that no eigensolver sees it. Eigen-decompositions in float64.
    """
    dtype = h.dtype
    h = tf.cast(h, tf.float64)
    d = int(h.shape[-1])
    finite = tf.reduce_all(tf.math.is_finite(h))
    eye = tf.eye(d, dtype=tf.float64)
    h = tf.where(finite, h, tf.broadcast_to(eye, tf.shape(h)))
    h = 0.5 * (h + tf.linalg.matrix_transpose(h))
    lam, u = tf.linalg.eigh(h)
    lam = tf.abs(lam) if eigenvalue_rule == "abs" else lam
    lam = tf.maximum(lam, min_eigenvalue) + damping
    if shrinkage:
        q = tf.matmul(u * lam[..., None, :], u, transpose_b=True)
        q = (1.0 - shrinkage) * q + shrinkage * tf.reduce_mean(q, axis=0, keepdims=True)
        lam, u = tf.linalg.eigh(0.5 * (q + tf.linalg.matrix_transpose(q)))
    return DenseCurvature.from_eigh(lam, u, finite, dtype)


class DenseCurvature(Curvature):
    """Per-particle dense Q_l (N, D, D) over the concatenation of all variables (one block)."""

    def __init__(self, q, q_inv, log_det, q_mean, q_mean_inv, finite, dims=None):
        super().__init__(q.shape[0])
        self.q, self.q_inv, self._log_det = q, q_inv, log_det
        self.q_mean, self.q_mean_inv, self._finite = q_mean, q_mean_inv, finite
        self.dims = [int(q.shape[-1])] if dims is None else list(dims)
        self.blocks = [list(range(len(self.dims)))]

    @classmethod
    def from_eigh(cls, lam, u, finite, dtype, dims=None):
        q = tf.matmul(u * lam[..., None, :], u, transpose_b=True)
        q_inv = tf.matmul(u / lam[..., None, :], u, transpose_b=True)
        log_det = tf.reduce_sum(tf.math.log(lam), axis=-1)
        q_mean = tf.reduce_mean(q, axis=0)
        lam_m, u_m = tf.linalg.eigh(0.5 * (q_mean + tf.transpose(q_mean)))
        q_mean_inv = tf.matmul(u_m / lam_m[None, :], u_m, transpose_b=True)
        cast = lambda t: tf.cast(t, dtype)  # noqa: E731
        return cls(
            cast(q), cast(q_inv), cast(log_det), cast(q_mean), cast(q_mean_inv), finite, dims
        )

    @classmethod
    def from_matrices(cls, q, dims=None):
        """From given SPD matrices (N, D, D) (no regularisation; for tests and custom preconditioners)."""
        q64 = tf.cast(q, tf.float64)
        lam, u = tf.linalg.eigh(0.5 * (q64 + tf.linalg.matrix_transpose(q64)))
        return cls.from_eigh(lam, u, tf.reduce_all(tf.math.is_finite(q64)), q.dtype, dims)

    def with_dims(self, dims):
        if sum(dims) != self.q.shape[-1]:
            raise ValueError(
                f"The preconditioner's curvature is {self.q.shape[-1]} x {self.q.shape[-1]} per "
                f"particle, but the particles have D = {sum(dims)} coordinates (variables of sizes "
                f"{list(dims)})."
            )
        return DenseCurvature(
            self.q, self.q_inv, self._log_det, self.q_mean, self.q_mean_inv, self._finite, dims
        )

    # -- list <-> concatenated ------------------------------------------------------------------
    def _join(self, vs):
        present = [v is not None for v in vs]
        if len(vs) != len(self.dims):
            raise ValueError(
                f"Expected {len(self.dims)} vector parts (one per variable); got {len(vs)}."
            )
        if not any(present):
            return None
        if not all(present):
            raise ValueError(
                "A dense curvature couples all variables: scope='layer' needs a block-diagonal "
                "preconditioner (one block per layer), or use scope='joint'."
            )
        return vs[0] if len(vs) == 1 else tf.concat(list(vs), axis=-1)

    def _split(self, v):
        return [v] if len(self.dims) == 1 else tf.split(v, self.dims, axis=-1)

    def _per_particle(self, mats, vs):
        v = self._join(vs)
        if v is None:
            return [None] * len(vs)
        flat = tf.reshape(v, (self.num_particles, -1, v.shape[-1]))
        out = tf.matmul(flat, mats)  # row l: v[l] Q_l (Q_l symmetric)
        return self._split(tf.reshape(out, tf.shape(v)))

    def _shared(self, mat, vs):
        v = self._join(vs)
        if v is None:
            return [None] * len(vs)
        return self._split(tf.einsum("...e,ed->...d", v, mat))

    def apply(self, vs):
        return self._per_particle(self.q, vs)

    def solve(self, vs):
        return self._per_particle(self.q_inv, vs)

    def apply_mean(self, vs):
        return self._shared(self.q_mean, vs)

    def solve_mean(self, vs):
        return self._shared(self.q_mean_inv, vs)

    def log_det(self, indices=None):
        if indices is not None and sorted(indices) != list(range(len(self.dims))):
            raise ValueError(
                "A dense curvature has one block over all variables; got a log-det request for "
                f"variables {sorted(indices)} only."
            )
        return self._log_det

    def is_finite(self):
        return self._finite


@keras.saving.register_keras_serializable(package="bayes_keras")
class CallablePreconditioner(Preconditioner):
    """Q_l from a user function of the particles: curvature_fn(x) -> (N, D, D), x the (N, D) particles.

    The function returns the curvature of the NEGATIVE log density (Hessian, Fisher, Gauss-Newton);
    it is symmetrised, eigenvalue-clipped and damped here (`regularize_curvature`), never inverted raw.
    Meant for the functional door and small problems (dense D x D per particle).

    Args:
        curvature_fn: callable (N, D) float tensor -> (N, D, D). Not serialized (bind it again).
        min_eigenvalue: eigenvalue floor (absolute, in the curvature's units; default 1e-2).
        damping: added to every eigenvalue after the floor (default 0).
        eigenvalue_rule: "clip" (max(lambda, floor), default) or "abs" (max(|lambda|, floor)).
        shrinkage: in [0, 1]; Q_l <- (1 - s) Q_l + s Q_bar (default 0.5, as the authors' toy code). Only
            the mixture mode sees it (the average Q_bar is unchanged): it keeps anchors with extreme
            point-wise curvature from dominating (on the 2-D toys, without it the mixture loses to vanilla
            SVGD on the double banana: benchmarks/svgd_toys.py); 0 is the paper's plain Eq. 17.
        dim: optional expected D, checked against the particles at build time.
    """

    def __init__(
        self,
        curvature_fn=None,
        min_eigenvalue=1e-2,
        damping=0.0,
        eigenvalue_rule="clip",
        shrinkage=0.5,
        dim=None,
    ):
        min_eigenvalue = check_number(min_eigenvalue, "min_eigenvalue (never invert a raw Hessian)")
        damping = check_number(damping, "damping", allow_zero=True)
        shrinkage = check_number(shrinkage, "shrinkage", positive=False)
        if not min_eigenvalue > 0:
            raise ValueError(
                f"min_eigenvalue must be positive (never invert a raw Hessian); got {min_eigenvalue!r}."
            )
        if not damping >= 0:
            raise ValueError(f"damping must be >= 0; got {damping!r}.")
        if eigenvalue_rule not in _RULES:
            raise ValueError(f"eigenvalue_rule must be one of {_RULES}; got {eigenvalue_rule!r}.")
        if not 0.0 <= shrinkage <= 1.0:
            raise ValueError(f"shrinkage must be in [0, 1]; got {shrinkage!r}.")
        if dim is not None and (isinstance(dim, bool) or int(dim) != dim or dim < 1):
            raise ValueError(f"dim must be a positive integer or None; got {dim!r}.")
        self.curvature_fn = curvature_fn
        self.min_eigenvalue, self.damping = float(min_eigenvalue), float(damping)
        self.eigenvalue_rule, self.shrinkage = eigenvalue_rule, float(shrinkage)
        self.dim = None if dim is None else int(dim)

    def build(self, view, add_variable, operators=None):
        super().build(view, add_variable, operators)
        total = sum(int(np.prod(s[1:])) for s in self._shapes)
        if self.dim is not None and self.dim != total:
            raise ValueError(
                f"{type(self).__name__} was declared for D = {self.dim} coordinates, but the particles "
                f"have D = {total} (variables of sizes {[int(np.prod(s[1:])) for s in self._shapes]})."
            )

    def blocks(self, num_variables):
        return [list(range(num_variables))]

    def raw_curvature(self, x):
        if self.curvature_fn is None:
            raise ValueError(
                f"{type(self).__name__} has no curvature function; pass curvature_fn=."
            )
        return self.curvature_fn(x)

    def update(self, particles, grads=None, records=(), step=None):
        dims = [int(p.shape[-1]) for p in particles]
        x = particles[0] if len(particles) == 1 else tf.concat(particles, axis=-1)
        h = tf.convert_to_tensor(self.raw_curvature(x))
        n, d = int(x.shape[0]), sum(dims)
        if (
            h.shape.rank != 3
            or (h.shape[0] is not None and h.shape[0] != n)
            or h.shape[1] != d
            or h.shape[2] != d
        ):
            raise ValueError(
                f"{type(self).__name__}: the curvature function must return (N, D, D) = ({n}, {d}, {d}) "
                f"for particles of shape ({n}, {d}); got {tuple(h.shape)}."
            )
        curv = regularize_curvature(
            tf.cast(h, x.dtype),
            self.min_eigenvalue,
            self.damping,
            self.eigenvalue_rule,
            self.shrinkage,
        )
        return curv.with_dims(dims)

    def get_config(self):
        return {
            "min_eigenvalue": self.min_eigenvalue,
            "damping": self.damping,
            "eigenvalue_rule": self.eigenvalue_rule,
            "shrinkage": self.shrinkage,
            "dim": self.dim,
        }


def hessian_of_negative_log_prob(log_prob_fn, x):
    """-grad^2 log p(x_l) for every row of x (N, D) -> (N, D, D), by nested autodiff."""
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            lp = tf.reduce_sum(log_prob_fn(x))
        g = inner.gradient(lp, x)
    return -outer.batch_jacobian(g, x)


@keras.saving.register_keras_serializable(package="bayes_keras")
class HessianPreconditioner(CallablePreconditioner):
    """Q_l = the exact Hessian of -log p at each particle (autodiff), eigenvalue-clipped and damped.

    The matrix-SVGD paper's choice for its 2-D toys. Rows of the log density must be independent
    (log_prob_fn maps (N, D) -> (N,) row by row). When `log_prob_fn` is None the functional door
    (bayes_keras.run_particles) binds its log density.

    Further arguments:

    - min_eigenvalue, damping, eigenvalue_rule, shrinkage, dim: as CallablePreconditioner.

    Args:
        log_prob_fn: (N, D) -> (N,) log density, or None (bound by run_particles). Not serialized.

    Example:
        >>> opt = bayes_keras.optimizers.MatrixSVGD(0.1, bayes_keras.preconditioners.HessianPreconditioner())
        >>> run = bayes_keras.run_particles(log_prob, x0, opt, 300)
    """

    def __init__(
        self,
        log_prob_fn=None,
        min_eigenvalue=1e-2,
        damping=0.0,
        eigenvalue_rule="clip",
        shrinkage=0.5,
        dim=None,
    ):
        super().__init__(None, min_eigenvalue, damping, eigenvalue_rule, shrinkage, dim)
        self.log_prob_fn = log_prob_fn

    def bind_log_prob(self, log_prob_fn):
        if self.log_prob_fn is None:
            self.log_prob_fn = log_prob_fn

    def build(self, view, add_variable, operators=None):
        super().build(view, add_variable, operators)
        self._check_bound()

    def _check_bound(self):
        if self.log_prob_fn is None:
            raise ValueError(
                "HessianPreconditioner has no log density: pass log_prob_fn=, or run the optimizer "
                "through bayes_keras.run_particles, which binds its log density. (Networks "
                "trained with model.fit need a curvature from the model, e.g. KFAC.)"
            )

    def raw_curvature(self, x):
        self._check_bound()
        return hessian_of_negative_log_prob(self.log_prob_fn, x)
