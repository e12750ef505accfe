"""The preconditioner interface consumed by MatrixSVGD (and any other curvature-aware method).

Two objects, so that the per-step tensors stay out of the (serializable) configuration:

- a `Preconditioner` says where the curvature comes from (an exact Hessian, a user function, KFAC
  statistics...). It is a small serializable object; persistent state (e.g. KFAC's running factors)
  lives in optimizer variables it creates in `build`, so it is saved with the model.
- every step, `Preconditioner.update(particles, grads)` returns a `Curvature`: an immutable operator
  holding this step's per-particle symmetric positive definite matrices Q_1, ..., Q_N (one per
  particle, Q_l = Q(x_l), already damped / eigenvalue-clipped) and their average Q_bar.

Interface (what a KFAC preconditioner implements as well; the `Curvature` it returns: curvature.py)::

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
"""

from bayes_keras._config import Configurable, config_repr


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
