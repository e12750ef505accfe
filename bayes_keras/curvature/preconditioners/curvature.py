"""Curvature: one step's curvature operator, what `Preconditioner.update` returns (base.py).

It holds this step's per-particle symmetric positive definite matrices Q_1, ..., Q_N (one per particle,
Q_l = Q(x_l), already damped / eigenvalue-clipped) and their average Q_bar, and is immutable.

Conventions. The particles are the optimizer's flattened particle variables: a list of V tensors
(N, d_v), D = sum_v d_v. Q is the curvature of the NEGATIVE log density (Hessian, Fisher, Gauss-Newton:
positive definite), so the preconditioned ascent direction is Q^{-1} grad log p. A `Curvature` is
block-diagonal over `blocks`: a partition of the variable indices that it never couples across (e.g.
one per layer, even if a layer has several Kronecker blocks inside, such as a recurrent layer's input
and recurrent blocks; a dense Hessian over all variables has one block; `None` means diagonal,
compatible with any grouping). MatrixSVGD(scope="layer") needs every block inside one layer group.

Vector arguments are lists aligned with the V variables; an entry may be None (not involved; the
result is None there) as long as each block is fully present or fully absent.

Interface::

    class Curvature:
        num_particles: int; blocks: list[list[int]] | None
        def apply(self, vs):       # vs[v]: (N, ..., d_v); row l uses Q_l:    Q_l v[l, ...]
        def solve(self, vs):       #                                        Q_l^{-1} v[l, ...]
        def apply_mean(self, vs):  # vs[v]: (..., d_v):                     Q_bar v
        def solve_mean(self, vs):  #                                        Q_bar^{-1} v
        def log_det(self, indices=None) -> (N,)   # log det Q_l over the variables `indices`
        def is_finite(self) -> scalar bool        # False: curvature not finite, the step is skipped

A KFAC Curvature holds, per layer block and per particle, damped factors A_l (in+1 with bias) and
G_l (out) with Q_l = A_l (x) G_l: apply is A_l V G_l on the (in+1, out) reshaping of a layer's
[kernel; bias] slice, solve uses the damped inverses, log_det = out log det A_l + (in+1) log det G_l,
and Q_bar = damp(mean_l A_l) (x) damp(mean_l G_l), with solve_mean its exact inverse
(kfac_preconditioner.py).
"""

import tensorflow as tf


class Curvature:
    """One step's curvature operator (see the module docstring). Subclasses implement the methods."""

    blocks = None

    def __init__(self, num_particles):
        self.num_particles = int(num_particles)

    def apply(self, vs):
        raise NotImplementedError

    def solve(self, vs):
        raise NotImplementedError

    def apply_mean(self, vs):
        raise NotImplementedError

    def solve_mean(self, vs):
        raise NotImplementedError

    def log_det(self, indices=None):
        raise NotImplementedError

    def is_finite(self):
        return tf.constant(True)
