"""MatrixSVGD: SVGD with matrix-valued kernels (Wang, Tang, Bajaj & Liu 2019)."""

import keras
import numpy as np

from bayes_keras import kernels as kernels_lib
from bayes_keras.inference.svgd import matrix_svgd_average_direction, matrix_svgd_mixture_direction
from bayes_keras.optimizers.preconditioned_optimizer import PreconditionedOptimizer

_MODES = ("average", "mixture")
_METRICS = ("q", "euclidean")
_SCOPES = ("joint", "layer")


@keras.saving.register_keras_serializable(package="bayes_keras")
class MatrixSVGD(PreconditionedOptimizer):
    """Stein variational gradient descent with matrix-valued kernels preconditioned by curvature
    ("Stein Variational Gradient Descent With Matrix-Valued Kernels", NeurIPS 2019,
    https://arxiv.org/abs/1910.12794).

    SVGD's scalar kernel k I is replaced by a matrix kernel built from a curvature Q (Hessian, Fisher,
    KFAC): running it is vanilla SVGD in the coordinates y = Q^{1/2} x, so ill-conditioned posteriors
    are explored at the speed of well-conditioned ones. The exact formulas (and the bandwidth
    constant) are in bayes_keras.inference.svgd.

    - mode="average" (Eqs. 12-15): one constant Q = Q_bar, the particles' average curvature;
      K(x, x') = Q^{-1} exp(-||x - x'||_Q^2 / h), h = median squared Q-distance / log N.
    - mode="mixture" (Eqs. 16-18): anchors = the particles, each with its own Q_l; the kernel mixes
      the anchors' kernels with Gaussian-mixture weights w_l(x) proportional to N(x; z_l, Q_l^{-1})
      (computed in log space with log det Q_l). Point-wise preconditioning, O(N^2) curvature
      applications per step. The mean entropy of the weights is kept in the optimizer variable
      `mixture_weight_entropy`, updated every applied step (log N: uniform; near 0: the weights
      collapsed to one-hot and the method became independent per-particle Newton steps with little
      repulsion; expect that in high dimension). It stays 0 in the average mode. The dense
      preconditioners shrink each Q_l halfway to the average by default (shrinkage=0.5, as the
      authors' code; on the 2-D toys it lowers the mixture's final MMD^2 2-10x).

    Defaults and why: mode="average" (the cheap and robust variant; the mixture's weights collapse
    in high dimension); kernel_metric="q" (the paper's Eq. 13: the kernel measures distances in the
    metric it preconditions with, which is what makes the change-of-variables equivalence hold;
    "euclidean" is the separable shortcut of the authors' BNN code, Euclidean RBF then Q^{-1},
    cheaper for the mixture); step_rule="sgd" (a diagonal adaptive rule after the preconditioner
    partly undoes it; Q^{-1} already makes the step scale-free, so learning rates of 0.1-1 are natural).

    Learning-rate scales differ by mode: with the median bandwidth the average mode's drift is about
    2 / N of a Newton step Q^-1 grad log p (the kernel sums to ~2 over the particles, divided by N),
    while the mixture mode, as its weights collapse to one-hot, approaches a full per-particle Newton
    step; expect usable mixture learning rates ~N / 2 times smaller (the breast_cancer grids of
    benchmarks/results/svgd_uci_logreg.md). With uniform weights and equal Q the two coincide (tested).

    Non-finite curvature skips the whole update (particles and step-rule state untouched; counted in
    `skipped_curvature_steps`). The preconditioner is told which curvature operators the mode calls
    (`curvature_operators`): with KFAC, mode="average" computes and stores only the mean curvature.

    Args:
        learning_rate: step size (default 0.1).
        preconditioner: a bayes_keras.preconditioners.Preconditioner (or "hessian" / "identity"):
            HessianPreconditioner for log densities through run_particles, KFAC for networks. None
            (default): KFAC inverted every step (preconditioned_optimizer.default_preconditioner).
        mode: "average" (default) or "mixture".
        kernel: the base scalar kernel (default RBF with the median rule; RBF or IMQ are radial and
            work in any metric).
        kernel_metric: "q" (default) or "euclidean".
        scope: "joint" (default, one kernel over all weights) or "layer" (one per layer; needs a
            preconditioner that is block-diagonal over layers).
        mixture_beta: exponent on the anchor densities in the mixture weights (default 1: Eq. 17;
            0: uniform weights, which with equal Q_l is exactly the average mode).
        step_rule: "sgd" (default), "rmsprop", "adam" or a StepRule.

    Example:
        >>> opt = bayes_keras.optimizers.MatrixSVGD(0.5, bayes_keras.preconditioners.HessianPreconditioner(),
        ...                                         mode="mixture")
        >>> run = bayes_keras.inference.run_particles(log_prob, x0, opt, 300)
    """

    def __init__(self, learning_rate=0.1, preconditioner=None, mode="average", kernel=None, kernel_metric="q",
                 scope="joint", mixture_beta=1.0, step_rule="sgd", **kwargs):
        if mode not in _MODES:
            raise ValueError(f"MatrixSVGD mode must be one of {_MODES}; got {mode!r}.")
        if kernel_metric not in _METRICS:
            raise ValueError(f"MatrixSVGD kernel_metric must be one of {_METRICS}; got {kernel_metric!r}.")
        if scope not in _SCOPES:
            raise ValueError(f"MatrixSVGD scope must be one of {_SCOPES}; got {scope!r}.")
        if isinstance(mixture_beta, bool) or not np.isfinite(mixture_beta) or mixture_beta < 0:
            raise ValueError(f"mixture_beta must be a non-negative number; got {mixture_beta!r}.")
        super().__init__(learning_rate=learning_rate, preconditioner=preconditioner, step_rule=step_rule, **kwargs)
        self.kernel = kernels_lib.get(kernel)
        if kernel_metric == "q" and not isinstance(self.kernel, kernels_lib.RadialKernel):
            raise ValueError(f"kernel_metric='q' needs a radial kernel (RBF, IMQ); got {self.kernel!r}. "
                             "Use kernel_metric='euclidean' for other kernels.")
        self.mode, self.kernel_metric, self.scope = mode, kernel_metric, scope
        self.mixture_beta = float(mixture_beta)

    @property
    def curvature_operators(self):
        """The `Curvature` methods this optimizer calls, read by preconditioners at build time so that they
        compute only those (KFAC skips its per-particle inverses in the average mode): ("apply_mean",
        "solve_mean") for mode="average", ("apply", "solve", "log_det") for mode="mixture"."""
        return ("apply_mean", "solve_mean") if self.mode == "average" else ("apply", "solve", "log_det")

    def check_num_particles(self, num_particles):
        if self.mode == "mixture" and num_particles < 2:
            raise ValueError(f"MatrixSVGD(mode='mixture') uses the particles as mixture anchors and needs at least "
                             f"2 particles; got num_particles={num_particles}. Use mode='average'.")
        if num_particles < 1:
            raise ValueError(f"MatrixSVGD needs at least one particle; got {num_particles}.")
        self.warn_if_one_particle(num_particles, "has no repulsion between particles and is a preconditioned MAP fit")

    # -- build / step --------------------------------------------------------------------------
    def _build_own_variables(self):
        self.mixture_weight_entropy = self.add_variable((), name="mixture_weight_entropy")

    def _check_preconditioner(self, blocks, layer_groups):
        self._check_blocks(blocks, self.kernel_groups(layer_groups))

    def kernel_groups(self, groups):
        """The index groups (over the particle variables) the kernel is computed on: all variables in one
        group for scope="joint", the per-layer `groups` for scope="layer"."""
        if self.scope == "joint":
            return [sorted(i for g in groups for i in g)]
        return groups

    @staticmethod
    def _check_blocks(blocks, groups):
        if blocks is None:
            return
        owner = {v: k for k, g in enumerate(groups) for v in g}
        for block in blocks:
            if len({owner.get(v) for v in block}) > 1:
                raise ValueError(f"The preconditioner couples variables {sorted(block)} that scope='layer' puts in "
                                 "different kernels; use scope='joint' or a preconditioner that is block-diagonal "
                                 "over layers.")

    def preconditioned_direction(self, particles, grads, groups, records):
        groups = self.kernel_groups(groups)
        curvature = self.preconditioner.update(particles, grads, records)
        if self.mode == "average":
            directions = matrix_svgd_average_direction(particles, grads, self.kernel, curvature, groups,
                                                       self.kernel_metric)
            entropy = None
        else:
            directions, entropy = matrix_svgd_mixture_direction(particles, grads, self.kernel, curvature, groups,
                                                                self.kernel_metric, self.mixture_beta)
        return directions, curvature.is_finite(), entropy

    def _after_step(self, entropy, writes):
        if entropy is not None:
            writes.assign(self.mixture_weight_entropy, entropy)

    def get_config(self):
        config = super().get_config()
        config.update({
            "mode": self.mode,
            "kernel": keras.saving.serialize_keras_object(self.kernel),
            "kernel_metric": self.kernel_metric,
            "scope": self.scope,
            "mixture_beta": self.mixture_beta,
        })
        return config
