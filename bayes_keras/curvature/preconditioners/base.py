"""The preconditioner interface consumed by MatrixSVGD (and any other curvature-aware method).

Two objects, so that the per-step tensors stay out of the (serializable) configuration:

- a `Preconditioner` says where the curvature comes from (an exact Hessian, a user function, KFAC
  statistics...). It is a small serializable object; persistent state (e.g. KFAC's running factors)
  lives in optimizer variables it creates in `build`, so it is saved with the model.
- every step, `Preconditioner.update(particles, grads)` returns a `Curvature`: an immutable operator
  holding this step's per-particle symmetric positive definite matrices Q_1, ..., Q_N (one per
  particle, Q_l = Q(x_l), already damped / eigenvalue-clipped) and their average Q_bar.

Conventions. The particles are the optimizer's flattened particle variables: a list of V tensors
(N, d_v), D = sum_v d_v. Q is the curvature of the NEGATIVE log density (Hessian, Fisher, Gauss-Newton:
positive definite), so the preconditioned ascent direction is Q^{-1} grad log p. A `Curvature` is
block-diagonal over `blocks`: a partition of the variable indices that it never couples across (e.g.
one per layer, even if a layer has several Kronecker blocks inside, such as a recurrent layer's input
and recurrent blocks; a dense Hessian over all variables has one block; `None` means diagonal,
compatible with any grouping). MatrixSVGD(scope="layer") needs every block inside one layer group.

Vector arguments are lists aligned with the V variables; an entry may be None (not involved; the
result is None there) as long as each block is fully present or fully absent.

Interface (what a KFAC preconditioner implements as well)::

    class Preconditioner(Configurable):
        curvature_request = None   # a bayes_keras.curvature.CurvatureRequest (e.g. KFAC's) makes BayesianModel
                                   # capture layer inputs / pre-activation gradients (curvature.capture)
        def build(self, view, add_variable, operators=None) -> None
            # once, from the optimizer's build. view: the optimizer's ParticleView (the flattened
            # particle variables' sizes, their layers and priors, view.layer_blocks: index lists,
            # one per layer). Create persistent state with add_variable (the optimizer's, so that it
            # is saved with the model); operators: the Curvature methods the optimizer will call (its
            # `curvature_operators`; None: all), so that only those are computed. Raise ValueError when
            # the preconditioner's dimensions do not match the particles'.
        def blocks(self, num_variables) -> list[list[int]] | None   # block structure (static)
        def bind_log_prob(self, log_prob_fn) -> None   # optional: the functional door's density
        def update(self, particles, grads, records=(), step=None) -> Curvature
            # every step, inside the compiled step; grads are of the NEGATIVE log joint; records:
            # the step's LayerRecords (StepInfo.curvature: layer inputs, per-example gradients
            # w.r.t. pre-activations) when curvature_request asked for them; step: the optimizer's
            # step t = 1, 2, ... (what a schedule such as KFAC's inversion period reads).

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
and Q_bar is its documented average (mean(A) (x) mean(G), or the mean of inverses for solve_mean).
"""

import tensorflow as tf

from bayes_keras._config import Configurable, config_repr


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


class Preconditioner(Configurable):
    """Base class of curvature sources (see the module docstring for the full interface)."""

    curvature_request = None

    def bind_log_prob(self, log_prob_fn):
        """The functional door's log density (`run_particles`); default: not needed."""

    def build(self, view, add_variable, operators=None):
        """`view`: the optimizer's `ParticleView` (shapes, layer blocks, layers and priors); `add_variable`:
        the optimizer's, for persistent state; `operators`: the Curvature methods the optimizer calls."""
        self._shapes = [(view.num_particles, d) for d in view.sizes]

    def blocks(self, num_variables):
        return None

    def update(self, particles, grads, records=(), step=None):
        raise NotImplementedError

    def __repr__(self):
        return config_repr(self)
