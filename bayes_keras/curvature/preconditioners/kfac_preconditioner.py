"""KFAC preconditioner: per-particle Kronecker-factored Fisher blocks for Dense, Conv2D and recurrent layers.

The statistics come from BayesianModel's curvature capture (bayes_keras.curvature.capture) and are
turned into factors by bayes_keras.curvature.kfac (see its docstring for the conventions: matrix
views, homogeneous coordinate for biases, locations, the scale n_train / temperature sitting in G,
the Kronecker blocks of recurrent layers). This module keeps running averages of the factors as
optimizer variables, damps and inverts them, and exposes them as a `Curvature`
(curvature/preconditioners/curvature.py).

Per layer (variable group) and particle l, Q_l is block-diagonal over the layer's Kronecker blocks,
each (A_l + pi sqrt(lambda) I) (x) (G_l + sqrt(lambda) / pi I) (the "pi-split" Tikhonov damping of
Martens & Grosse 2015, pi = sqrt((tr A / dim A) / (tr G / dim G)), per particle, clipped to
[1e-8, 1e8], 1 when a trace is 0), lambda = damping + the prior's precision / temperature (below).

Prior: Q is meant to be the curvature of the NEGATIVE LOG POSTERIOR
(curvature/preconditioners/curvature.py); the Normal prior adds its precision 1 / (s^2 T) to every
coordinate, which a Kronecker product cannot hold exactly, so (include_prior=True, default) it is
added to the damping lambda of each block (the coordinate-weighted mean of the block's prior
precisions, e.g. 1 for the default N(0, 1) prior, divided by the model's temperature T). Priors
without a `stddev` add nothing.

Mean curvature Q_bar (apply_mean / solve_mean, MatrixSVGD's "average" mode): per block
damp(mean_l A_l) (x) damp(mean_l G_l), the mean of the RAW running factors, damped like a particle's
(its own pi), and solve_mean is its exact inverse, so the metric and the preconditioner of the
average kernel are the same Q_bar. (The mean of Kronecker products is not a Kronecker product;
mean(A) (x) mean(G) differs from mean_l(A_l (x) G_l) by the cross-particle covariance of the factors.
The authors' code instead solves with mean_l(A_l^-1) (x) mean_l(G_l^-1), which is not the inverse of
any Q_bar it uses as a metric.)

Schedule, inside the compiled step (tf.cond), with t the optimizer step that `update` is handed (iterations + 1)
(1, 2, ...), f = factor_period and k = inversion_period (a multiple of f):
- statistics (this batch's factors and the running average F <- rho F + (1 - rho) F_batch,
  rho = min(1 - 1/u, ema_decay), u = 1, 2, ... counting the statistics updates, so the first takes the
  batch factors; ema_decay therefore applies PER STATISTICS UPDATE, not per step) on every step of the
  warm-up t <= k, then on the steps t = 0 mod f. On the other steps nothing is computed: the curvature
  is the stored damped factors / inverses of the last inversion (BayesianModel still captures the
  layers' inputs and pre-activation gradients every step, which costs little, and with fisher="true"
  still runs its second backward pass for the sampled labels).
- inversion (damped factors, their inverses by eigendecomposition in float64, log-determinants) on
  every statistics update of the warm-up t <= k, then on the steps t = 0 mod k. The warm-up makes the
  first inverses follow the running average of 1, 2, ..., k batches instead of resting on the first
  minibatch for k steps (a one-batch inverse made early steps diverge).
A batch whose factors are not finite leaves every state untouched (the statistics counter too) and the
returned curvature reports is_finite() False, so the optimizer skips the step.
Cost: factor_period=1 (default) computes the factors every step, which dominates the step time of
small networks; factor_period = inversion_period (e.g. KFACPreconditioner(inversion_period=20,
factor_period=20)) computes them once per period, right before the inversion: the setting to use when
step time matters (the running average then spans about 20 statistics updates, ~400 steps; measured in
docs/design_measurements.md, "Curvature").

What is inverted: a consumer may declare the `Curvature` methods it calls as the attribute
`curvature_operators` of the optimizer that builds the preconditioner (a tuple of "apply", "solve",
"log_det", "apply_mean", "solve_mean"; None or absent: all). The per-particle damped factors, inverses
and log-determinants (N eigendecompositions per factor) are computed only when "apply", "solve" or
"log_det" is declared, Q_bar's only when "apply_mean" or "solve_mean" is; the variables exist either
way (the optimizer's variables, hence saved models, do not depend on the consumer; those not computed
keep their initial identity / zero values) and calling an operator that was not declared raises.
MatrixSVGD declares ("apply_mean", "solve_mean") in mode="average" (the per-particle eigendecompositions
are most of an inversion's cost) and ("apply", "solve", "log_det") in
mode="mixture".
"""

import math

import keras
import numpy as np
import tensorflow as tf

from bayes_keras._config import decay_rate, is_real
from bayes_keras.curvature import kfac as kfac_lib
from bayes_keras.curvature.records import CurvatureRequest
from bayes_keras.curvature.preconditioners.base import Preconditioner
from bayes_keras.curvature.preconditioners.curvature import Curvature
from bayes_keras.curvature.preconditioners.kfac_layer_state import (
    KFACLayerState,
    KroneckerOperator,
    damped_inverses,
    not_declared,
)

__all__ = ["KFACPreconditioner", "KFACCurvature", "KroneckerOperator", "damped_inverses"]

PER_PARTICLE_OPERATORS = ("apply", "solve", "log_det")


def _whole(value):
    """A whole number (int, or a float equal to one; not a bool, not inf / NaN)."""
    return is_real(value) and math.isfinite(value) and int(value) == value


MEAN_OPERATORS = ("apply_mean", "solve_mean")


class KFACCurvature(Curvature):
    """Per-particle Q_l, block-diagonal over layers (`blocks`), each layer a block-diagonal of Kronecker
    products A (x) G acting on its (rows, columns) matrix views as A V G (see `KroneckerOperator`)."""

    def __init__(self, num_particles, dims, views, layers, finite):
        super().__init__(num_particles)
        self.dims = [int(d) for d in dims]
        self.views = [tuple(v) for v in views]
        self.layers = [(list(indices), list(ops)) for indices, ops in layers]
        self.blocks = [list(indices) for indices, _ in self.layers]
        self._finite = finite

    def _transform(self, vs, which):
        if len(vs) != len(self.dims):
            raise ValueError(
                f"Expected {len(self.dims)} vector parts (one per variable); got {len(vs)}."
            )
        per_particle = which in ("apply", "solve")
        out = [None] * len(vs)
        for indices, ops in self.layers:
            present = [vs[i] is not None for i in indices]
            if not any(present):
                continue
            if not all(present):
                raise ValueError(
                    f"KFAC curvature: variables {indices} form one layer block; got vectors for only "
                    f"{[i for i, p in zip(indices, present) if p]} of them."
                )
            parts = {i: [] for i in indices}
            for op in ops:
                c0, c1 = op.columns
                mats, dtype = [], vs[op.pieces[0][0]].dtype
                for i, r0, rc in op.pieces:
                    rows, width = self.views[i]
                    shape = (
                        (self.num_particles, -1, rows, width) if per_particle else (-1, rows, width)
                    )
                    mats.append(tf.reshape(vs[i], shape)[..., r0 : r0 + rc, c0:c1])
                v = mats[0] if len(mats) == 1 else tf.concat(mats, axis=-2)
                left, right = (tf.cast(m, dtype) for m in op.pair(which))
                if per_particle:
                    left, right = left[:, None], right[:, None]
                result = tf.matmul(tf.matmul(left, v), right)
                start = 0
                for i, r0, rc in op.pieces:
                    parts[i].append((r0, c0, result[..., start : start + rc, :]))
                    start += rc
            for i in indices:
                out[i] = tf.reshape(_assemble(parts[i]), tf.shape(vs[i]))
        return out

    def apply(self, vs):
        return self._transform(vs, "apply")

    def solve(self, vs):
        return self._transform(vs, "solve")

    def apply_mean(self, vs):
        return self._transform(vs, "apply_mean")

    def solve_mean(self, vs):
        return self._transform(vs, "solve_mean")

    def log_det(self, indices=None):
        chosen = set(range(len(self.dims)) if indices is None else indices)
        total = None
        for layer_indices, ops in self.layers:
            inside = chosen.intersection(layer_indices)
            if not inside:
                continue
            if len(inside) != len(layer_indices):
                raise ValueError(
                    f"KFAC curvature: variables {layer_indices} form one layer block; a log-det was "
                    f"requested over {sorted(inside)} of them only."
                )
            for op in ops:
                if op.log_det is None:
                    raise ValueError(not_declared("log_det"))
                total = op.log_det if total is None else total + op.log_det
        if total is None:
            return tf.zeros((self.num_particles,))
        return total

    def is_finite(self):
        return self._finite


def _assemble(parts):
    """(row start, column start, (..., rows, cols) tensor) pieces of one variable -> its (..., rows, width)."""
    by_row = {}
    for r0, c0, t in parts:
        by_row.setdefault(r0, []).append((c0, t))
    rows = []
    for r0 in sorted(by_row):
        cols = [t for _, t in sorted(by_row[r0], key=lambda ct: ct[0])]
        rows.append(cols[0] if len(cols) == 1 else tf.concat(cols, axis=-1))
    return rows[0] if len(rows) == 1 else tf.concat(rows, axis=-2)


@keras.saving.register_keras_serializable(package="bayes_keras")
class KFACPreconditioner(Preconditioner):
    """Kronecker-factored Fisher curvature per particle and layer (KFAC: Martens & Grosse 2015,
    https://arxiv.org/abs/1503.05671, factors Sec. 3, factored Tikhonov damping Sec. 6.3; convolutions:
    Grosse & Martens 2016, https://arxiv.org/abs/1602.01407; recurrent layers: Martens, Ba & Johnson 2018,
    https://openreview.net/forum?id=HyMTkQZAb), for
    networks of bayes_keras Dense, Conv2D, SimpleRNN, LSTM and GRU particle layers (Bidirectional:
    each direction is its own layer) trained through BayesianModel.fit.

    The conventions (scale, locations, recurrent blocks) are in bayes_keras.curvature.kfac; damping,
    prior, the mean curvature, the schedule and what is inverted in this module's docstring.

    Schedule in short (t = optimizer step, 1, 2, ...): warm-up t <= inversion_period: statistics and
    inversion every step (the first inverses follow the running average, not one minibatch); then
    statistics (the batch's factors + their running average) every `factor_period` steps and the
    inversion every `inversion_period` steps. Only what the optimizer's `curvature_operators` declares
    is inverted (MatrixSVGD(mode="average"): the mean curvature only).

    Speed: the default factor_period=1 computes the factors every step; for speed use
    factor_period = inversion_period, e.g. KFACPreconditioner(inversion_period=20, factor_period=20)
    (step times and accuracies of both settings: benchmarks/results/svgd_digits.md).

    Args:
        damping: Tikhonov damping lambda > 0 added (pi-split) to every Kronecker block, in the units of
            the tempered data-set Fisher (default 1e-3).
        ema_decay: running-average decay in [0, 1) PER STATISTICS UPDATE (every `factor_period` steps
            after the warm-up); rho_u = min(1 - 1/u, ema_decay), u = 1, 2, ... counting the statistics
            updates (default 0.95). For small models whose curvature changes fast while the particles
            travel (a logistic regression), ema_decay=0 with inversion_period=1 follows it; the EMA
            lagged and doubled the iterations on breast_cancer (docs/architecture.md).
        inversion_period: recompute the damped factors and inverses every this many optimizer steps,
            and every step during the first inversion_period steps (warm-up) (default 20).
        fisher: "empirical" (observed labels, default) or "true" (labels sampled from the model's own
            predictive, one per example and particle: BayesianModel then runs a second backward pass
            to the pre-activations).
        damping_split: True (default): A + pi sqrt(lambda) I, G + sqrt(lambda) / pi I; False: pi = 1.
        include_prior: add the Normal prior's precision / temperature to lambda (default True).
        factor_period: compute the batch's factors and update their running average every this many
            optimizer steps after the warm-up (default 1: every step); inversion_period must be a
            multiple of it (the inverses are recomputed right after a statistics update). Skipped steps
            reuse the stored damped factors and inverses.

    Example:
        >>> pre = bayes_keras.preconditioners.KFACPreconditioner(inversion_period=20, factor_period=20)
        >>> opt = bayes_keras.optimizers.MatrixSVGD(0.01, pre)
        >>> model.compile(optimizer=opt)
        >>> model.fit(x, y, epochs=10)
    """

    def __init__(
        self,
        damping=1e-3,
        ema_decay=0.95,
        inversion_period=20,
        fisher="empirical",
        damping_split=True,
        include_prior=True,
        factor_period=1,
    ):
        if not is_real(damping) or not np.isfinite(damping) or not damping > 0:
            raise ValueError(
                f"KFAC damping must be a positive number (never invert a raw curvature); got {damping!r}."
            )
        ema_decay = decay_rate(ema_decay, "KFAC ema_decay")
        if not _whole(inversion_period) or inversion_period < 1:
            raise ValueError(
                f"KFAC inversion_period must be a positive integer; got {inversion_period!r}."
            )
        if not _whole(factor_period) or factor_period < 1:
            raise ValueError(
                f"KFAC factor_period must be a positive integer; got {factor_period!r}."
            )
        if int(inversion_period) % int(factor_period):
            raise ValueError(
                f"KFAC inversion_period ({inversion_period}) must be a multiple of factor_period "
                f"({factor_period}): the inverses are recomputed right after a statistics update. "
                "E.g. inversion_period=20, factor_period=20."
            )
        if fisher not in kfac_lib.FISHER_TYPES:
            raise ValueError(f"KFAC fisher must be one of {kfac_lib.FISHER_TYPES}; got {fisher!r}.")
        self.damping, self.ema_decay = float(damping), float(ema_decay)
        self.inversion_period, self.fisher = int(inversion_period), fisher
        self.damping_split, self.include_prior = bool(damping_split), bool(include_prior)
        self.factor_period = int(factor_period)
        self._built = False
        self._per_particle = self._mean = None

    @property
    def curvature_request(self):
        return CurvatureRequest(
            "kronecker_factors", "sampled" if self.fisher == "true" else "observed"
        )

    # -- build -----------------------------------------------------------------------------------
    def build(self, view, add_variable, operators=None):
        """Create the running factors, damped factors and inverses (identity until the first inversion)
        as optimizer variables, one `KFACLayerState` per layer. The structure comes from the layers'
        particle variables (names and shapes, `bayes_keras.curvature.kfac.candidate_specs`), grouped per
        layer by the optimizer's ParticleView; the first step checks it against the captured layers."""
        super().build(view, add_variable, operators)
        self._per_particle, self._mean = _needs(operators)
        if not view.has_layers:
            raise ValueError(
                "KFACPreconditioner needs the particle variables grouped by layer: use it inside a "
                "BayesianModel built from bayes_keras particle layers. The "
                "functional door has no layers: use HessianPreconditioner there."
            )
        self._layers = [
            KFACLayerState(
                add_variable,
                [view.variables[i] for i in group],
                group,
                [view.priors[i] for i in group],
                self._shapes,
            )
            for group in view.layer_blocks
        ]  # one group per layer (the interface's contract)
        self._views = [None] * len(view.variables)
        for layer in self._layers:
            for i, matrix in layer.views.items():
                self._views[i] = matrix
        self._updates = add_variable((), dtype="int64", name="kfac_updates")
        self._num_particles = self._shapes[0][0]
        self._built = True

    def blocks(self, num_variables):
        if not self._built:
            return None
        return [list(layer.order) for layer in self._layers]

    # -- step ------------------------------------------------------------------------------------
    def batch_factors(self, records):
        """This step's factors from the step's records: a list (one per layer) of {name: (N, d, d)}.

        Also resolves each layer's structure against the captured layer (errors for unsupported layers
        or a mismatch with the structure inferred from the variables) and its prior precisions."""
        return self._factors(self._layer_records(records))

    def _layer_records(self, records):
        """The record of each layer, in order (resolving structure and prior precisions)."""
        if not records:
            raise ValueError(
                "KFACPreconditioner needs the layers' captured statistics: train through "
                "BayesianModel.fit (the optimizer's curvature_request makes the model capture them)."
            )
        return [layer.resolve(records) for layer in self._layers]

    def _factors(self, records):
        return [
            layer.batch_factors(record, self.fisher) for layer, record in zip(self._layers, records)
        ]

    @staticmethod
    def _temperature(records):
        temps = [r.temperature for r in records if getattr(r, "temperature", None) is not None]
        return float(temps[0]) if temps else 1.0

    def _due(self, period, step):
        """Whether the optimizer's step t (1, 2, ...) is in the warm-up (t <= inversion_period) or a multiple
        of `period`."""
        t = tf.cast(step, tf.int64)
        return (t <= self.inversion_period) | tf.equal(tf.math.floormod(t, period), 0)

    def update(self, particles=None, grads=None, records=(), step=None):
        """This step's statistics (when due) and the current `KFACCurvature`. `step`: the optimizer's step t =
        1, 2, ... that the schedule reads; None (a direct call outside an optimizer): the count of statistics
        updates so far + 1."""
        if not self._built:
            raise ValueError(
                "KFACPreconditioner.update before build (build it through the optimizer's build)."
            )
        step = self._updates + 1 if step is None else step
        temperature = self._temperature(records)
        # structure checks: every step, outside the conditional
        records = self._layer_records(records)
        if self.factor_period == 1:
            finite = self._statistics(records, temperature, step)
        else:
            finite = tf.cond(
                self._due(self.factor_period, step),
                lambda: self._statistics(records, temperature, step),
                lambda: tf.constant(True),
            )
        return self.curvature(finite)

    def _statistics(self, records, temperature, step):
        """This batch's factors into the running averages, then the inversion when due; returns whether
        the batch's factors were finite (if not, nothing changed)."""
        batch = self._factors(records)
        finite = tf.constant(True)
        for factors in batch:
            for f in factors.values():
                finite = finite & tf.reduce_all(tf.math.is_finite(f))

        def accumulate():
            t = tf.cast(self._updates + 1, tf.float64)
            rho64 = tf.minimum(1.0 - 1.0 / t, self.ema_decay)
            for layer, factors in zip(self._layers, batch):
                layer.accumulate(factors, rho64)
            self._updates.assign_add(1)
            return tf.constant(True)

        tf.cond(finite, accumulate, lambda: tf.constant(False))
        due = finite & self._due(self.inversion_period, step)

        def run_inversion():
            self.invert(temperature)
            return tf.constant(True)

        tf.cond(due, run_inversion, lambda: tf.constant(False))
        return finite

    def damping_for(self, layer_index, role, temperature=1.0):
        """lambda of one block: damping + (its prior precision / temperature when include_prior)."""
        lam = self.damping
        if self.include_prior:
            lam += self._layers[layer_index].prior.get(role, 0.0) / float(temperature)
        return lam

    def invert(self, temperature=1.0):
        """Recompute the damped factors, inverses and log-determinants from the running factors now (the
        schedule calls it inside the step; public for profiling and for subclasses)."""
        for k, layer in enumerate(self._layers):
            layer.invert(
                lambda role, k=k: self.damping_for(k, role, temperature),
                self._per_particle,
                self._mean,
                self.damping_split,
            )

    def curvature(self, finite=None):
        """The current `KFACCurvature` (the damped factors and inverses of the last inversion)."""
        layers = [
            (layer.order, layer.operators(self._per_particle, self._mean)) for layer in self._layers
        ]
        finite = tf.constant(True) if finite is None else finite
        return KFACCurvature(
            self._num_particles, [s[1] for s in self._shapes], self._views, layers, finite
        )

    @property
    def updates(self):
        """Number of statistics updates so far (an optimizer variable)."""
        return self._updates

    @property
    def inverts_per_particle(self):
        """Whether the per-particle damped factors / inverses / log-dets are computed (None before build)."""
        return self._per_particle

    @property
    def inverts_mean(self):
        """Whether Q_bar's damped factors / inverses are computed (None before build)."""
        return self._mean

    @property
    def factor_variables(self):
        """[{factor name: (N, d, d) running-average variable}] per layer group, in the optimizer's order."""
        return [dict(layer.factors) for layer in self._layers]

    def block_variables(self, layer_index):
        """{block role: {"a", "g", "a_inv", "g_inv", "log_det", "a_mean", ...: variable}} of one layer group
        (all exist; those not computed, see `inverts_per_particle` / `inverts_mean`, keep their initial
        identity / zero values)."""
        return {
            role: {k: v for k, v in b.items() if k not in ("p", "q")}
            for role, b in self._layers[layer_index].blocks.items()
        }

    def get_config(self):
        return {
            "damping": self.damping,
            "ema_decay": self.ema_decay,
            "inversion_period": self.inversion_period,
            "fisher": self.fisher,
            "damping_split": self.damping_split,
            "include_prior": self.include_prior,
            "factor_period": self.factor_period,
        }


def _needs(operators):
    """(per-particle, mean) from an optimizer's declared `curvature_operators` (None: both)."""
    if operators is None:
        return True, True
    known = PER_PARTICLE_OPERATORS + MEAN_OPERATORS
    operators = tuple(operators)
    unknown = [o for o in operators if o not in known]
    if unknown or not operators:
        raise ValueError(
            f"curvature_operators must be a non-empty collection of {known} (or None: all); got "
            f"{operators!r}."
        )
    return (
        any(o in PER_PARTICLE_OPERATORS for o in operators),
        any(o in MEAN_OPERATORS for o in operators),
    )
