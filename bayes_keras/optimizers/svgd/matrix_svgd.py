"""MatrixSVGD: SVGD with matrix-valued kernels (Wang, Tang, Bajaj & Liu 2019)."""

import keras
import tensorflow as tf

from bayes_keras import kernels as kernels_lib
from bayes_keras.curvature import preconditioners
from bayes_keras._config import check_number
from bayes_keras.core.particle_optimizer import ParticleOptimizer
from bayes_keras.core.step_rules import signal_share
from bayes_keras.core.particle_view import merged
from bayes_keras.training.memory_guard import check_fits, tensor_bytes
from bayes_keras.optimizers.svgd.stein import (
    matrix_svgd_average_direction,
    matrix_svgd_mixture_direction,
    quadratic_model_scale,
)

_MODES = ("average", "mixture")
_METRICS = ("q", "euclidean")
_SCOPES = ("joint", "layer")
_RESCALINGS = ("auto", "quadratic", "none")
# The signal share's running averages span ~1 / (1 - decay) = 33 steps: a constant, not an argument (chosen
# on the defaults table over 3 seeds, docs/results.md, "Defaults").
_RESCALING_DECAY = 0.97


@keras.saving.register_keras_serializable(package="bayes_keras")
class MatrixSVGD(ParticleOptimizer):
    """Stein variational gradient descent with matrix-valued kernels preconditioned by curvature (Wang,
    Tang, Bajaj & Liu, "Stein Variational Gradient Descent With Matrix-Valued Kernels", NeurIPS 2019,
    https://arxiv.org/abs/1910.12794). SVGD's scalar kernel k I becomes a matrix kernel built from a
    curvature Q (Hessian, Fisher, KFAC): it is vanilla SVGD in the coordinates y = Q^{1/2} x, so
    ill-conditioned posteriors are explored at the speed of well-conditioned ones.

    The paper's equations and the functions that implement them (the formulas, with the bandwidth
    constant, in the docstring of bayes_keras.optimizers.svgd.stein):

        Eqs. 12-15, mode="average": one constant Q = Q_bar, the particles' mean curvature;
            K(x, x') = Q^-1 exp(-||x - x'||_Q^2 / h)              `stein.matrix_svgd_average_direction`
        Eqs. 16-18, mode="mixture": the particles as anchors, each with its own Q_l, mixed with
            weights w_l(x) ~ N(x; z_l, Q_l^-1)^beta             `stein.matrix_svgd_mixture_direction`,
                                                                   `stein.mixture_log_weights`
        Q, Q^-1 and log det Q: the preconditioner (KFAC by default)   `curvature.preconditioners`
        step size (an extension, rescaling="quadratic"): the step a quadratic model with curvature
            Q_bar takes along the driving term (KFAC's rescaling, Martens & Grosse 2015, Sec. 6.4),
            times the share of it that persists between steps      `stein.quadratic_model_scale`,
                                                                   `step_rules.signal_share`

    Defaults: mode="average" (cheap and robust; the mixture's weights collapse in high dimension, which
    the optimizer variable `mixture_weight_entropy` shows: log N uniform, near 0 one-hot, i.e.
    per-particle Newton steps with little repulsion); kernel_metric="q" (Eq. 13: distances in the metric
    the kernel preconditions with, which makes the change of variables exact; "euclidean" is the
    separable shortcut of the authors' code); step_rule="sgd" (the preconditioner already scales the
    step); rescaling="auto" ("quadratic" in the average mode: with the median bandwidth the average
    mode's drift is about 2 / N of a Newton step, so one fixed learning rate cannot suit N = 10 and
    N = 100; a positive factor per step leaves SVGD's fixed points unchanged; "none" is the paper's plain
    x <- x + learning_rate * phi, and the mixture mode is never rescaled). The measurements behind them:
    docs/results.md ("Defaults"). Non-finite curvature skips the whole update (counted in
    `skipped_curvature_steps`); with KFAC, mode="average" computes only the mean curvature.

    Args:
        learning_rate: step size (default 0.35): a fraction of the rescaled step in the average mode (see
            "Step size"), the plain step size with rescaling="none" or mode="mixture".
        preconditioner: a bayes_keras.preconditioners.Preconditioner (or "hessian" / "identity"):
            HessianPreconditioner for log densities through run_particles, KFAC for networks. None
            (default): KFAC inverted every step (`bayes_keras.preconditioners.default_preconditioner()`).
        mode: "average" (default) or "mixture".
        kernel: the base scalar kernel (default RBF with the median rule; RBF or IMQ are radial and
            work in any metric).
        kernel_metric: "q" (default) or "euclidean".
        scope: "joint" (default, one kernel over all weights) or "layer" (one per layer; needs a
            preconditioner that is block-diagonal over layers).
        mixture_beta: exponent on the anchor densities in the mixture weights (default 1: Eq. 17;
            0: uniform weights, which with equal Q_l is exactly the average mode).
        step_rule: "sgd" (default), "rmsprop", "adam" or a StepRule.
        rescaling: "auto" (default: "quadratic" in the average mode, "none" in the mixture mode),
            "quadratic" (average mode only) or "none".

    Example:
        >>> opt = bayes_keras.optimizers.MatrixSVGD(0.5, bayes_keras.preconditioners.HessianPreconditioner(),
        ...                                         mode="mixture")
        >>> run = bayes_keras.run_particles(log_prob, x0, opt, 300)
    """

    step_headroom = 18  # its preconditioner's state and products (benchmarks/size_guard_peaks.py)
    pairwise_tensors = 16  # N x N kernels and their gradients (benchmarks/size_guard_peaks.py)

    def __init__(
        self,
        learning_rate=0.35,
        preconditioner=None,
        mode="average",
        kernel=None,
        kernel_metric="q",
        scope="joint",
        mixture_beta=1.0,
        step_rule="sgd",
        rescaling="auto",
        **kwargs,
    ):
        if mode not in _MODES:
            raise ValueError(f"MatrixSVGD mode must be one of {_MODES}; got {mode!r}.")
        if kernel_metric not in _METRICS:
            raise ValueError(
                f"MatrixSVGD kernel_metric must be one of {_METRICS}; got {kernel_metric!r}."
            )
        if scope not in _SCOPES:
            raise ValueError(f"MatrixSVGD scope must be one of {_SCOPES}; got {scope!r}.")
        if rescaling not in _RESCALINGS:
            raise ValueError(
                f"MatrixSVGD rescaling must be one of {_RESCALINGS}; got {rescaling!r}."
            )
        if rescaling == "quadratic" and mode == "mixture":
            raise ValueError(
                "MatrixSVGD rescaling='quadratic' is defined for mode='average' only (its driving term "
                "has one curvature); use rescaling='none' or 'auto' with mode='mixture'."
            )
        mixture_beta = check_number(mixture_beta, "mixture_beta", allow_zero=True)
        super().__init__(learning_rate=learning_rate, step_rule=step_rule, **kwargs)
        self.preconditioner = preconditioners.get(preconditioner)
        self.kernel = kernels_lib.get(kernel)
        if kernel_metric == "q" and not isinstance(self.kernel, kernels_lib.RadialKernel):
            raise ValueError(
                f"kernel_metric='q' needs a radial kernel (RBF, IMQ); got {self.kernel!r}. "
                "Use kernel_metric='euclidean' for other kernels."
            )
        self.mode, self.kernel_metric, self.scope = mode, kernel_metric, scope
        self.mixture_beta = float(mixture_beta)
        self.rescaling = rescaling

    @property
    def curvature_request(self):
        """What the model captures for the preconditioner (e.g. KFAC's Kronecker factors)."""
        return self.preconditioner.curvature_request

    def bind_log_prob(self, log_prob_fn):
        """The functional door's density, for a HessianPreconditioner."""
        self.preconditioner.bind_log_prob(log_prob_fn)

    @property
    def _rescaled(self):
        return self.mode == "average" and self.rescaling != "none"

    @property
    def curvature_operators(self):
        """The `Curvature` methods this optimizer calls, read by preconditioners at build time so that they
        compute only those (KFAC skips its per-particle inverses in the average mode): ("apply_mean",
        "solve_mean") for mode="average", ("apply", "solve", "log_det") for mode="mixture"."""
        return (
            ("apply_mean", "solve_mean")
            if self.mode == "average"
            else ("apply", "solve", "log_det")
        )

    def check_num_particles(self, num_particles):
        if self.mode == "mixture" and num_particles < 2:
            raise ValueError(
                f"MatrixSVGD(mode='mixture') uses the particles as mixture anchors and needs at least "
                f"2 particles; got num_particles={num_particles}. Use mode='average'."
            )
        if num_particles < 1:
            raise ValueError(f"MatrixSVGD needs at least one particle; got {num_particles}.")
        self.warn_if_one_particle(
            num_particles, "has no repulsion between particles and is a preconditioned MAP fit"
        )

    # -- build / step --------------------------------------------------------------------------
    def check_step_fits(self):
        if self.mode == "mixture" and self.view.variables:
            # The mixture broadcasts every particle against every anchor: (N, N, D) tensors (the particles'
            # images under each anchor's Q, and their differences), a few of them alive at once.
            n, dim = self.view.num_particles, sum(self.view.sizes)
            check_fits(
                3 * tensor_bytes((n, n, dim + 4), self.view.variables[0].dtype),
                f"MatrixSVGD(mode='mixture') with {n} particles of {dim} weights (per step, tensors of shape "
                f"({n}, {n}, {dim}))",
                "Use mode='average' (O(N^2 + N D)), fewer particles, or scope='layer'.",
            )
        super().check_step_fits()

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.mixture_weight_entropy = self.add_variable((), name="mixture_weight_entropy")
        if self._rescaled:
            # Running first moment of each particle's driving term and, per kernel block, of its squared norm:
            # the signal share (their bias correction 1 - decay^t reads the count of committed steps).
            kernel_blocks = self.kernel_blocks(self.view.layer_blocks)
            self.drift_average = [
                self.add_variable((self.view.num_particles, size), name=f"drift_average_{i}")
                for i, size in enumerate(self.view.sizes)
            ]
            self.drift_square_average = self.add_variable(
                (len(kernel_blocks),), name="drift_square_average"
            )
        self.skipped_curvature_steps = self.add_variable(
            (), dtype="int64", name="skipped_curvature_steps"
        )
        if self.view.variables:
            self.preconditioner.build(self.view, self.add_variable, self.curvature_operators)
            self._check_blocks(
                self.preconditioner.blocks(len(self.view)),
                self.kernel_blocks(self.view.layer_blocks),
            )

    def kernel_blocks(self, layer_blocks):
        """The blocks (index lists over the particle variables) a kernel is computed on: one block of all
        variables for scope="joint", the view's `layer_blocks` for scope="layer"."""
        if self.scope == "joint":
            return merged(layer_blocks)
        return layer_blocks

    @staticmethod
    def _check_blocks(preconditioner_blocks, kernel_blocks):
        if preconditioner_blocks is None:
            return
        owner = {v: k for k, g in enumerate(kernel_blocks) for v in g}
        for block in preconditioner_blocks:
            if len({owner.get(v) for v in block}) > 1:
                raise ValueError(
                    f"The preconditioner couples variables {sorted(block)} that scope='layer' puts in "
                    "different kernels; use scope='joint' or a preconditioner that is block-diagonal "
                    "over layers."
                )

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        """One step (called by BayesianOptimizer.update with the gradients of the NEGATIVE log joint per particle
        variable): the preconditioner's curvature for this step, the Stein direction, the step rule, and the
        rescaling's running averages. Every new value goes into `writes` (a StateWrites): BayesianOptimizer.apply
        writes them all, or, if any is not finite or the curvature is not, none (KFAC's running statistics,
        which describe the data, are updated by `preconditioner.update` itself)."""
        particles, grads = self.view.flat_particles(), self.view.flat_gradients(grads)
        kernel_blocks = self.kernel_blocks(self.view.layer_blocks)
        curvature = self.preconditioner.update(
            particles, grads, preconditioners.step_records(step), iteration
        )
        state = [] if self._rescaled else None  # the rescaled average mode's new running averages
        entropy = None  # the mixture mode's mean entropy of the mixture weights
        if self.mode == "average":
            rescale = (
                (lambda *args: self._rescale(state, kernel_blocks, *args))
                if self._rescaled
                else None
            )
            directions = matrix_svgd_average_direction(
                particles,
                grads,
                self.kernel,
                curvature,
                kernel_blocks,
                self.kernel_metric,
                rescale=rescale,
            )
        else:
            directions, entropy = matrix_svgd_mixture_direction(
                particles,
                grads,
                self.kernel,
                curvature,
                kernel_blocks,
                self.kernel_metric,
                self.mixture_beta,
            )
        preconditioners.require_finite_curvature(curvature, self.skipped_curvature_steps, writes)
        self.step_particles(directions, learning_rate, iteration, writes)
        if entropy is not None:
            writes.assign(self.mixture_weight_entropy, entropy)
        for positions, means, index, squares in state or ():
            for v, m in zip(positions, means):
                writes.assign(self.drift_average[v], m)
            writes.assign(
                self.drift_square_average,
                tf.tensor_scatter_nd_update(
                    writes.read(self.drift_square_average), [[index]], tf.reshape(squares, (1,))
                ),
            )

    def _rescale(self, state, kernel_blocks, index, score, drift, curvature_drift):
        """The average mode's step scale for kernel block `index`: alpha * rho, with alpha the quadratic model's
        step along the driving term (`quadratic_model_scale`) and rho = |m|^2 / v in [0, 1], the fraction of the
        driving term that persists from step to step (m: running mean of each particle's driving term, v:
        running mean of its squared norm, both bias-corrected; Jensen: |m|^2 <= v). Full batch, rho -> 1 and
        the step is the quadratic model's; with minibatch noise around the optimum, rho falls toward
        (1 - decay) / (1 + decay), shrinking the step as the optimal SGD step shrinks with the gradient's noise
        (Balles, Romero & Hennig 2017, "Coupling Adaptive Batch Sizes with Learning Rates")."""
        decay = _RESCALING_DECAY
        positions = kernel_blocks[index]
        means = [
            decay * self.drift_average[v] + (1.0 - decay) * d for v, d in zip(positions, drift)
        ]
        square = tf.add_n([tf.reduce_sum(tf.square(d)) for d in drift])
        squares = decay * self.drift_square_average[index] + (1.0 - decay) * square
        # The averages advance on committed steps only, as `iterations`: this is their (t)-th update.
        correction = 1.0 - tf.pow(
            tf.constant(decay, square.dtype), tf.cast(self.iterations + 1, square.dtype)
        )
        rho = signal_share(
            tf.add_n([tf.reduce_sum(tf.square(m)) for m in means]), squares, correction
        )
        state.append((positions, means, index, squares))
        return quadratic_model_scale(score, drift, curvature_drift) * rho

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "preconditioner": keras.saving.serialize_keras_object(self.preconditioner),
                "mode": self.mode,
                "kernel": keras.saving.serialize_keras_object(self.kernel),
                "kernel_metric": self.kernel_metric,
                "scope": self.scope,
                "mixture_beta": self.mixture_beta,
                "rescaling": self.rescaling,
            }
        )
        return config
