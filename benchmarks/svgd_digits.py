"""Matrix-valued-kernel SVGD (KFAC) vs vanilla SVGD on scikit-learn's digits: a GRU's held-out error,
and LeNet-5's training and step time (issue #3).

Part 1 (--part gru): the 8x8 digits read as sequences of 8 rows of 8 pixels by a GRU classifier
(bk.zoo.gru_classifier: GRU(32 units) -> Dense(10), every weight a particle, N = 10 particles, N(0, 1)
prior, batch 64, EPOCHS = 20 epochs as the paper's RNN experiment) trained through model.fit on the
library's stratified 75/25 split (bk.datasets.load_digits(): 1,347 train / 450 test) with

  vanilla            bk.optimizers.SVGD(lr): RBF kernel, median / log N bandwidth, joint scope, the
                     library's default step rule (dimension-wise RMSProp shared by the particles)
  average (T_inv)    bk.optimizers.MatrixSVGD(lr, KFACPreconditioner(inversion_period=T_inv),
                     mode="average"): Q-metric kernel on the particles' mean KFAC curvature (Eqs. 12-15),
                     the library's default step rule (plain SGD: Q^-1 already makes the step scale-free)
  average (T_inv=20, T_f=20)  the same with KFACPreconditioner(inversion_period=20, factor_period=20): the
                     KFAC statistics only every 20 steps, right before the inversion (the fast setting)
  mixture (T_inv)    the same with mode="mixture" (anchors = particles, per-particle KFAC Q_l, Eqs. 16-18)

KFAC: empirical Fisher, damping 1e-3 + the prior precision (1), EMA 0.95 (per statistics update), all
library defaults except the inversion period (and the factor period where named). T_inv = 5 is the
authors' setting for small data sets (1,347 examples is one); T_inv = 20 is the library default. Every
KFAC run inverts on each of its first T_inv steps (the library's warm-up), then every T_inv steps.

Tuning (fair, no test data): each method's learning rate (and, for the average mode, nothing else) is
chosen on a grid by the validation NLL after the last epoch, training on 75% of the training split and
validating on the other 25% (stratified, random_state 0), seed 0. Grids: GRID below. The chosen
configuration is then trained on the whole training split with seeds SEEDS and scored on the test split
(error = 1 - accuracy of the particle-averaged predictive, NLL of the predictive; mean ± std over seeds).

Part 2 (--part lenet): LeNet-5 (bk.zoo.lenet5, N = 10, batch 64) with MatrixSVGD(mode="average",
KFACPreconditioner(inversion_period=20, factor_period=20)) (the fast setting; factor_period=1, the
library default, alongside):
  (a) training: test accuracy / NLL after LENET_EPOCHS epochs of model.fit, seed 0, for a few learning
      rates (a training check, not a tuned comparison; vanilla SVGD alongside);
  (b) step time against vanilla SVGD (N = 10, batch 64), timed side by side in one run with the paired,
      interleaved harness of benchmarks/step_time.py (its Variant / Group / run_rounds / summarise are
      imported, not copied): each variant runs its own compiled train function on a persistent tf.data
      iterator repeating one fixed batch (what fit executes per step); per round every variant runs a
      block of `--steps` steps (default 20 = the inversion period, so every MatrixSVGD block contains
      exactly one statistics update and inversion: the amortised cost) back to back in shuffled order;
      every variant first runs past KFAC's warm-up (statistics and inversion on each of the first 20
      steps); ratios are medians of per-round (paired) ratios. Learning rates are tiny (1e-4) during
      timing so that 1,000 steps on one repeated batch cannot diverge: a diverged run skips its updates
      (non-finite guard) and would time a cheaper step; skipped-step counters are checked and reported.
      Acceptance: MatrixSVGD(average, KFAC(inversion_period=20, factor_period=20)) / SVGD <= 1.5.
  (c) profile: the same paired run also times variants that add one piece of MatrixSVGD at a time
      (SVGD with plain SGD; + curvature capture; + KFAC factors and EMA every step; + the Q-metric
      kernel and Q_bar^-1; inversion every step, mean only as the average mode does, or per particle as
      well), so that the paired differences are the costs of the pieces, and op-level microbenchmarks
      time each layer's factor computation (with the previous einsum / extract_patches ops for
      comparison), each block's inversion and the directions.

Usage:
    python benchmarks/svgd_digits.py                 # both parts (~10 minutes on 2 shared CPU cores)
    python benchmarks/svgd_digits.py --part gru      # part 1 only (~8 minutes)
    python benchmarks/svgd_digits.py --part lenet    # part 2 only (~3 minutes)
    python benchmarks/svgd_digits.py --quick         # ~2-3 minute smoke run (1 seed, short, small grid)
    python benchmarks/svgd_digits.py --render        # rewrite the .md from the .json only
Writes benchmarks/results/svgd_digits.{json,md} (svgd_digits_quick.* with --quick). A one-part run keeps
the other part's results from the existing .json (each part records its own command, date and load).

MatrixSVGD runs the paper's plain iteration x <- x + learning_rate * phi (`rescaling="none"`) at the learning
rates given here; the library's default (rescaling="auto") scales the step by a quadratic model (see its
docstring), so these tables were measured, and reproduce, without it.
"""

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bayes_keras as bk  # noqa: E402
import harness  # noqa: E402
import step_time  # noqa: E402  (the paired, interleaved timing harness)
from bayes_keras.curvature import kfac as kfac_lib  # noqa: E402
from bayes_keras.optimizers.svgd.stein import matrix_svgd_average_direction, svgd_direction  # noqa: E402
from bayes_keras.curvature.preconditioners.kfac_preconditioner import damped_inverses  # noqa: E402

tf.get_logger().setLevel("ERROR")
# a diverging grid point warns once per skipped step; the counts are recorded instead
warnings.filterwarnings(
    "ignore", message=".*training step\\(s\\) skipped.*", category=RuntimeWarning
)

RESULTS_DIR = harness.RESULTS_DIR
PARTICLES, BATCH, UNITS = 10, 64, 32
EPOCHS, LENET_EPOCHS = 20, 10
SEEDS = (0, 1, 2)
# method -> (mode, inversion period, learning-rate grid)
GRID = {
    "vanilla": (None, None, (3e-3, 1e-2, 3e-2, 1e-1)),
    "average (T_inv=5)": ("average", 5, (0.03, 0.1, 0.3)),
    "average (T_inv=20)": ("average", 20, (0.03, 0.1, 0.3)),
    "average (T_inv=20, T_f=20)": ("average", (20, 20), (0.03, 0.1, 0.3)),
    "mixture (T_inv=5)": ("mixture", 5, (3e-3, 1e-2, 3e-2)),
}
QUICK_GRID = {
    k: (mode, period, (lrs[1],)) for k, (mode, period, lrs) in GRID.items()
}  # one lr each
LENET_MSVGD_LRS, LENET_SVGD_LR = (1e-2, 3e-2), 1e-2
TIMING_LR = 1e-4
FAST = {"inversion_period": 20, "factor_period": 20}  # the acceptance configuration


# -- part 1: GRU on digit rows ------------------------------------------------------------------------
def gru_optimizer(mode, period, lr):
    """period: the inversion period, or (inversion period, factor period)."""
    if mode is None:
        return bk.optimizers.SVGD(lr)
    inversion, factor = period if isinstance(period, tuple) else (period, 1)
    return bk.optimizers.MatrixSVGD(
        lr, kfac(inversion, factor_period=factor), mode=mode, rescaling="none"
    )


def skipped_steps(model, optimizer):
    """(steps skipped by the model's non-finite guard, steps skipped for non-finite curvature)."""
    model_skips = model.skipped_steps
    curvature = getattr(optimizer, "skipped_curvature_steps", None)
    return model_skips, (int(curvature.numpy()) if curvature is not None else 0)


def train_and_score(build_model, optimizer, xtr, ytr, xev, yev, seed, epochs):
    keras.utils.set_random_seed(seed)
    model = build_model()
    model.compile(optimizer=optimizer, metrics=["accuracy"])
    t0 = time.perf_counter()
    history = model.fit(xtr, ytr, batch_size=BATCH, epochs=epochs, verbose=0)
    seconds = time.perf_counter() - t0
    scores = bk.metrics.evaluate_probs(model.predict(xev, verbose=0), yev)
    scores = {k: float(v) for k, v in scores.items()}
    scores["error"] = 1.0 - scores["accuracy"]
    model_skips, curvature_skips = skipped_steps(model, optimizer)
    entropy = getattr(optimizer, "mixture_weight_entropy", None)
    return {
        **scores,
        "fit_seconds": seconds,
        "skipped_steps": model_skips,
        "skipped_curvature_steps": curvature_skips,
        "mixture_weight_entropy": float(entropy.numpy())
        if entropy is not None and optimizer.mode == "mixture"
        else None,
        "train_nll_per_epoch": [float(v) for v in history.history["nll"]],
    }


def _finite_or_inf(v):
    return v if np.isfinite(v) else math.inf


def run_gru(args, log):
    from sklearn.model_selection import train_test_split

    (xtr, ytr), (xte, yte) = bk.datasets.load_digits(image=True)  # the library's stratified split
    xfit, xval, yfit, yval = train_test_split(
        xtr, ytr, test_size=0.25, random_state=0, stratify=ytr
    )
    grid = QUICK_GRID if args.quick else GRID

    def build():
        return bk.zoo.gru_classifier(
            PARTICLES, units=UNITS
        )  # (8, 8, 1) images -> 8 rows of 8 pixels

    tuning, chosen = {}, {}
    for method, (mode, period, lrs) in grid.items():
        tuning[method] = []
        for lr in lrs:
            r = train_and_score(
                build,
                gru_optimizer(mode, period, lr),
                xfit,
                yfit,
                xval,
                yval,
                args.tune_seed,
                args.epochs,
            )
            tuning[method].append({"learning_rate": lr, **r})
            log(
                f"  tune {method:20s} lr {lr:<6g} val NLL {r['nll']:.4f} err {r['error']:.4f} "
                f"skipped {r['skipped_steps']}/{r['skipped_curvature_steps']} ({r['fit_seconds']:.0f} s)"
            )
        best = min(tuning[method], key=lambda r: (_finite_or_inf(r["nll"]), r["error"]))
        chosen[method] = best["learning_rate"]

    final = {}
    for method, (mode, period, _) in grid.items():
        final[method] = []
        for seed in args.seeds:
            r = train_and_score(
                build,
                gru_optimizer(mode, period, chosen[method]),
                xtr,
                ytr,
                xte,
                yte,
                seed,
                args.epochs,
            )
            final[method].append({"seed": seed, **r})
            log(
                f"  test {method:20s} seed {seed} err {r['error']:.4f} NLL {r['nll']:.4f} "
                f"skipped {r['skipped_steps']}/{r['skipped_curvature_steps']} ({r['fit_seconds']:.0f} s)"
            )
    return {
        "grid": {
            m: {
                "mode": mode,
                "inversion_period": p[0] if isinstance(p, tuple) else p,
                "factor_period": p[1] if isinstance(p, tuple) else (None if p is None else 1),
                "learning_rates": list(lrs),
            }
            for m, (mode, p, lrs) in grid.items()
        },
        "chosen_learning_rate": chosen,
        "tuning": tuning,
        "final": final,
        "weights_per_particle": int(sum(np.prod(v.shape[1:]) for v in build().particle_variables)),
        "split": {
            "train": len(xtr),
            "test": len(xte),
            "tune_fit": len(xfit),
            "tune_validation": len(xval),
        },
    }


def _mean_std(values, fmt="{:.4f}"):
    v = np.array(values, dtype=float)
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(v.mean())} ± {fmt.format(v.std())}"


def gru_tables(result):
    lines = [
        "| method | step rule | lr (chosen) | test error | test NLL | ECE | fit s / run | skipped steps | "
        "mixture entropy (nats) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for method, runs in result["final"].items():
        rule = "dim-wise RMSProp" if method == "vanilla" else "SGD"
        skips = sum(r["skipped_steps"] + r["skipped_curvature_steps"] for r in runs)
        ent = [r["mixture_weight_entropy"] for r in runs if r["mixture_weight_entropy"] is not None]
        lines.append(
            f"| {method} | {rule} | {result['chosen_learning_rate'][method]:g} | "
            f"{_mean_std([r['error'] for r in runs])} | {_mean_std([r['nll'] for r in runs])} | "
            f"{_mean_std([r['ece'] for r in runs])} | "
            f"{_mean_std([r['fit_seconds'] for r in runs], '{:.0f}')} | "
            f"{skips} | {', '.join(f'{e:.3f}' for e in ent) if ent else '-'} |"
        )
    grid = [
        "| method | lr | validation NLL | validation error | skipped steps (model / curvature) |",
        "|---|---|---|---|---|",
    ]
    for method, runs in result["tuning"].items():
        for r in runs:
            mark = (
                " **(chosen)**"
                if r["learning_rate"] == result["chosen_learning_rate"][method]
                else ""
            )
            grid.append(
                f"| {method} | {r['learning_rate']:g}{mark} | {r['nll']:.4f} | {r['error']:.4f} | "
                f"{r['skipped_steps']} / {r['skipped_curvature_steps']} |"
            )
    return "\n".join(lines), "\n".join(grid)


# -- part 2: LeNet-5 ------------------------------------------------------------------------------------
class CaptureOnlySVGD(bk.optimizers.MatrixSVGD):
    """Profile variant: the model captures KFAC statistics (inputs, pre-activation gradients) but the step
    is vanilla SVGD with plain SGD (no factors, no inverses, no Q-metric kernel)."""

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        particles, grads = self.view.flat_particles(), self.view.flat_gradients(grads)
        d = svgd_direction(
            particles, grads, self.kernel, self.kernel_blocks(self.view.layer_blocks)
        )
        self.step_particles(d, learning_rate, iteration, writes)


class FactorsOnlySVGD(bk.optimizers.MatrixSVGD):
    """Profile variant: capture + this batch's KFAC factors + their EMA (and the preconditioner's inversion
    schedule), but the step is vanilla SVGD with plain SGD."""

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        particles, grads = self.view.flat_particles(), self.view.flat_gradients(grads)
        curvature = self.preconditioner.update(
            particles, grads, bk.preconditioners.step_records(step), iteration
        )
        d = svgd_direction(
            particles, grads, self.kernel, self.kernel_blocks(self.view.layer_blocks)
        )
        bk.preconditioners.require_finite_curvature(curvature, self.skipped_curvature_steps, writes)
        self.step_particles(d, learning_rate, iteration, writes)


class FullInversionMatrixSVGD(bk.optimizers.MatrixSVGD):
    """Profile variant: MatrixSVGD that declares no curvature_operators, so that KFAC inverts the
    per-particle factors too (what the library did in every mode before the average mode declared that it
    needs the mean only)."""

    curvature_operators = None


class NoInversionKFAC(bk.preconditioners.KFACPreconditioner):
    """Profile variant: KFAC statistics on the library's schedule, but never inverted (Q_bar stays I)."""

    def invert(self, temperature):
        pass


def kfac(inversion_period, **kwargs):
    return bk.preconditioners.KFACPreconditioner(inversion_period=inversion_period, **kwargs)


# key -> (description, optimizer factory); the first two are the acceptance pair, the rest the profile
TIMING_VARIANTS = {
    "svgd": ("SVGD, RBF, dim-wise RMSProp (library default)", lambda lr: bk.optimizers.SVGD(lr)),
    "matrix_svgd": (
        "MatrixSVGD average, KFAC(inversion_period=20, factor_period=20), SGD",
        lambda lr: bk.optimizers.MatrixSVGD(lr, kfac(**FAST), rescaling="none"),
    ),
    "matrix_svgd_factor_every_step": (
        "MatrixSVGD average, KFAC(inversion_period=20) (factor_period=1, the library default)",
        lambda lr: bk.optimizers.MatrixSVGD(lr, kfac(20), rescaling="none"),
    ),
    "svgd_sgd": (
        "SVGD with plain SGD (MatrixSVGD's step rule)",
        lambda lr: bk.optimizers.SVGD(lr, step_rule="sgd"),
    ),
    "capture": (
        "+ KFAC capture (layer inputs, pre-activation gradients); vanilla SVGD step, SGD",
        lambda lr: CaptureOnlySVGD(lr, NoInversionKFAC(inversion_period=1)),
    ),
    "factors": (
        "+ KFAC factors of every batch and their EMA; vanilla SVGD step, SGD",
        lambda lr: FactorsOnlySVGD(lr, NoInversionKFAC(inversion_period=1)),
    ),
    "no_inversion": (
        "MatrixSVGD average, KFAC factors every step, never inverted (all but the inversions)",
        lambda lr: bk.optimizers.MatrixSVGD(
            lr, NoInversionKFAC(inversion_period=1), rescaling="none"
        ),
    ),
    "inversion_every_step": (
        "MatrixSVGD average, KFAC(inversion_period=1): mean-only inversion every step",
        lambda lr: bk.optimizers.MatrixSVGD(lr, kfac(1), rescaling="none"),
    ),
    "full_inversion_every_step": (
        "the same, inverting the per-particle factors too (no curvature_operators)",
        lambda lr: FullInversionMatrixSVGD(lr, kfac(1), rescaling="none"),
    ),
    "identity_q": (
        "MatrixSVGD average with Q = I (IdentityPreconditioner: no capture, no KFAC)",
        lambda lr: bk.optimizers.MatrixSVGD(
            lr, bk.preconditioners.IdentityPreconditioner(), rescaling="none"
        ),
    ),
}
QUICK_TIMING = (
    "svgd",
    "matrix_svgd",
    "matrix_svgd_factor_every_step",
    "svgd_sgd",
    "factors",
    "no_inversion",
)
PAIR = (("matrix_svgd/svgd", "matrix_svgd", "svgd"),)
KFAC_WARMUP = FAST[
    "inversion_period"
]  # steps of KFAC's warm-up (statistics + inversion every step)


def lenet(n=PARTICLES):
    return bk.zoo.lenet5((8, 8, 1), 10, num_particles=n)


def run_lenet_training(args, log):
    (xtr, ytr), (xte, yte) = bk.datasets.load_digits(image=True)
    runs = []
    configs = [
        ("vanilla SVGD (dim-wise RMSProp)", LENET_SVGD_LR, lambda lr: bk.optimizers.SVGD(lr))
    ]
    lrs = LENET_MSVGD_LRS[:1] if args.quick else LENET_MSVGD_LRS
    configs += [
        (
            "MatrixSVGD average, KFAC(T_inv=20, factor_period=20)",
            lr,
            lambda lr: bk.optimizers.MatrixSVGD(lr, kfac(**FAST), rescaling="none"),
        )
        for lr in lrs
    ]
    configs += [
        (
            "MatrixSVGD average, KFAC(T_inv=20) (factor_period=1)",
            lr,
            lambda lr: bk.optimizers.MatrixSVGD(lr, kfac(20), rescaling="none"),
        )
        for lr in lrs
    ]
    for name, lr, make in configs:
        r = train_and_score(lenet, make(lr), xtr, ytr, xte, yte, 0, args.lenet_epochs)
        runs.append({"method": name, "learning_rate": lr, **r})
        log(
            f"  lenet {name:55s} lr {lr:<6g} acc {r['accuracy']:.4f} NLL {r['nll']:.4f} "
            f"skipped {r['skipped_steps']}/{r['skipped_curvature_steps']} ({r['fit_seconds']:.0f} s)"
        )
    return runs


def run_lenet_timing(args, log):
    x, y, dataset_size = step_time.fixed_batch("lenet5")
    iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    keys = QUICK_TIMING if args.quick else tuple(TIMING_VARIANTS)
    members, models = {}, {}
    for key in keys:
        model = step_time.bayesian_model(
            "lenet5", PARTICLES, TIMING_VARIANTS[key][1](TIMING_LR), dataset_size
        )
        v = step_time.Variant(
            "lenet5",
            key,
            PARTICLES,
            [model],
            [step_time.make_stepper(model, x, y, "fit", iterator)],
        )
        for _ in range(
            args.warmup + KFAC_WARMUP + 1
        ):  # past KFAC's warm-up: the steady state is timed
            harness.sync(v.step())
        members[key], models[key] = v, model
        log(f"  built {key}")
    group = step_time.Group("lenet5", PARTICLES, members)
    step_time.run_rounds([group], args.rounds, args.steps, args.seed, time.perf_counter())
    variants = {k: (chr(ord("a") + i), TIMING_VARIANTS[k][0]) for i, k in enumerate(keys)}
    rows = step_time.summarise([group], variants, PAIR)
    visits = group.visits

    def paired(fn):
        return statistics.median(fn(v) for v in visits)

    ms = {k: 1e3 * statistics.median(v[k] for v in visits) for k in keys}
    pieces = {}

    def piece(name, a, b, scale=1.0):
        if a in keys and b in keys:
            pieces[name] = 1e3 * scale * paired(lambda v: v[a] - v[b])

    piece("step rule: dim-wise RMSProp - SGD (svgd - svgd_sgd)", "svgd", "svgd_sgd")
    piece(
        "curvature capture + pre-activation gradients (capture - svgd_sgd)", "capture", "svgd_sgd"
    )
    piece("KFAC factors of the batch + EMA (factors - capture)", "factors", "capture")
    if "capture" not in keys:
        piece("capture + KFAC factors + EMA (factors - svgd_sgd)", "factors", "svgd_sgd")
    piece(
        "Q-metric kernel, Q_bar and Q_bar^-1 products (no_inversion - factors)",
        "no_inversion",
        "factors",
    )
    piece(
        "one mean-only inversion, as the average mode does (inversion_every_step - no_inversion)",
        "inversion_every_step",
        "no_inversion",
    )
    piece(
        "mean-only inversion amortised over 20 steps",
        "inversion_every_step",
        "no_inversion",
        1.0 / 20,
    )
    piece(
        "one full inversion, per particle + mean (full_inversion_every_step - no_inversion)",
        "full_inversion_every_step",
        "no_inversion",
    )
    piece("Q-metric kernel with Q = I (identity_q - svgd_sgd)", "identity_q", "svgd_sgd")
    piece(
        "total MatrixSVGD(factor_period=1) - SVGD (paired)", "matrix_svgd_factor_every_step", "svgd"
    )
    piece("total MatrixSVGD(factor_period=20) - SVGD (paired)", "matrix_svgd", "svgd")
    skipped = {
        k: dict(zip(("model", "curvature"), skipped_steps(m, m.optimizer)))
        for k, m in models.items()
    }
    ratios = {k: paired(lambda v, k=k: v[k] / v["svgd"]) for k in keys}
    return {
        "rows": rows,
        "variants": {k: {"letter": variants[k][0], "description": variants[k][1]} for k in keys},
        "ms_per_step": ms,
        "ratio_to_svgd": ratios,
        "paired_pieces_ms": pieces,
        "skipped": skipped,
        "raw_visits": visits,
        "settings": {
            "rounds": args.rounds,
            "steps_per_block": args.steps,
            "warmup": args.warmup,
            "learning_rate": TIMING_LR,
        },
    }


def _time_interleaved(fns, reps, seed=0):
    """Median wall milliseconds of compiled zero-argument functions, timed interleaved: every repetition
    calls each function once, in shuffled order (so that slow phases of the shared machine hit all alike)."""
    import random

    def sync(out):
        for t in tf.nest.flatten(out):
            if hasattr(t, "numpy"):
                t.numpy()

    for fn in fns.values():
        sync(fn())  # trace
    rng = random.Random(seed)
    samples = {k: [] for k in fns}
    for _ in range(reps):
        for k in rng.sample(list(fns), len(fns)):
            t0 = time.perf_counter()
            sync(fns[k]())
            samples[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in samples.items()}


def _previous_patches(layer, x):
    """The library's conv patches before the sliced version: tf.image.extract_patches."""
    kh, kw = layer.kernel_size
    images = x if layer.broadcasts else tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0))
    patches = tf.image.extract_patches(
        images,
        sizes=[1, kh, kw, 1],
        strides=[1, *layer.strides, 1],
        rates=[1, *layer.dilation_rate, 1],
        padding=layer.padding.upper(),
    )
    return tf.reshape(
        patches,
        (tf.shape(x)[0], 1 if layer.broadcasts else layer.num_particles, -1, patches.shape[-1]),
    )


def run_microbenchmarks(args, log):
    """Op-level costs on one LeNet batch: each layer's KFAC factors (and the conv patches, with the previous
    extract_patches / einsum ops for comparison), each block's inversion (per-particle vs mean only), the
    whole inversion (mean only as in the average mode, and full) and the directions."""
    reps = 8 if args.quick else 30
    x, y, dataset_size = step_time.fixed_batch("lenet5")
    keras.utils.set_random_seed(0)
    model = lenet()
    pre = kfac(**FAST)
    opt = FullInversionMatrixSVGD(
        TIMING_LR, pre
    )  # the per-particle state is computed too, to time both
    model.compile(optimizer=opt, dataset_size=dataset_size)
    model.fit(
        x, y, batch_size=BATCH, epochs=1, verbose=0
    )  # builds the optimizer and the KFAC state
    # The mean-only inversion of the average mode, on a preconditioner of its own.
    mean_model = lenet()
    pre_mean = kfac(**FAST)
    mean_model.compile(
        optimizer=bk.optimizers.MatrixSVGD(TIMING_LR, pre_mean), dataset_size=dataset_size
    )
    mean_model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    _, step = model.bayesian_gradients(
        x, y
    )  # the step's captured curvature records, as fit hands them over
    records = list(step.curvature)

    def closure(f, *a):
        return tf.function(lambda: f(*a))

    def einsum_a(p):
        return tf.einsum("bnli,bnlj->nij", p, p)

    fns, shapes, differences = {}, {}, {}
    for r in records:
        name = r.layer.name
        shapes[name] = {
            k: tuple(int(d) for d in v.shape) for k, v in kfac_lib.kfac_factors(r).items()
        }
        fns[f"factors/{name}"] = closure(kfac_lib.kfac_factors, r)
        if type(r.layer).__name__ == "Conv2D":
            patches = kfac_lib.conv_patches(r.layer, r.inputs)
            previous = _previous_patches(r.layer, r.inputs)
            shapes[name]["patches"] = tuple(int(d) for d in patches.shape)
            fns[f"patches/{name}"] = closure(kfac_lib.conv_patches, r.layer, r.inputs)
            fns[f"matmul_A/{name}"] = closure(
                lambda p: kfac_lib.input_factor(p, False, PARTICLES), patches
            )
            fns[f"old_patches/{name}"] = closure(_previous_patches, r.layer, r.inputs)
            fns[f"old_einsum_A/{name}"] = closure(einsum_a, previous)
            old = tf.broadcast_to(
                einsum_a(previous), (PARTICLES,) + tuple(einsum_a(previous).shape[1:])
            )
            new = kfac_lib.input_factor(patches, False, PARTICLES) * tf.cast(
                tf.shape(patches)[0] * tf.shape(patches)[2], tf.float32
            )
            differences[name] = float(tf.reduce_max(tf.abs(new - old)) / tf.reduce_max(tf.abs(old)))
    fns["factors/all layers"] = tf.function(
        lambda: [t for r in records for t in kfac_lib.kfac_factors(r).values()]
    )

    inversion_names = []
    for layer, factors in zip(model.particle_layers, pre.factor_variables):
        for block in kfac_lib.kronecker_spec(layer).blocks:
            a = tf.cast(factors[block.a].value, tf.float64)
            g = tf.cast(factors[block.g].value, tf.float64)
            name = f"{layer.name}/{block.role} A{tuple(a.shape)} G{tuple(g.shape)}"
            inversion_names.append(name)
            fns[f"inv_pp/{name}"] = closure(lambda a, g: damped_inverses(a, g, 1.0), a, g)
            fns[f"inv_mean/{name}"] = closure(
                lambda a, g: damped_inverses(tf.reduce_mean(a, 0), tf.reduce_mean(g, 0), 1.0), a, g
            )

    def whole_inversion(preconditioner):  # the library's invert: mean only (average mode) / in full
        def run():
            preconditioner.invert(1.0)
            return tf.constant(0.0)

        return tf.function(run)

    fns["inv_all_mean"] = whole_inversion(pre_mean)
    fns["inv_all_full"] = whole_inversion(pre)

    n = PARTICLES
    xs = [tf.reshape(v.value, (n, -1)) for v in model.particle_variables]
    gs = [tf.random.normal(t.shape, seed=1) for t in xs]
    groups = [list(range(len(xs)))]
    curvature = pre.curvature()
    kernel = opt.kernel
    directions = {
        "vanilla SVGD direction": tf.function(lambda: svgd_direction(xs, gs, kernel, groups)),
        "average direction, Q metric (Q_bar x, kernel, Q_bar^-1 drift)": tf.function(
            lambda: matrix_svgd_average_direction(xs, gs, kernel, curvature, groups)
        ),
        "average direction, euclidean metric (Q_bar^-1 on vanilla)": tf.function(
            lambda: matrix_svgd_average_direction(xs, gs, kernel, curvature, groups, "euclidean")
        ),
        "Q_bar apply (all layers)": tf.function(lambda: curvature.apply_mean(xs)),
        "Q_bar solve (all layers)": tf.function(lambda: curvature.solve_mean(xs)),
    }
    fns.update({f"dir/{k}": f for k, f in directions.items()})
    t = _time_interleaved(fns, reps)

    out = {"reps": reps, "factors_ms": {}, "inversion_ms": {}, "direction_ms": {}}
    for r in records:
        name = r.layer.name
        entry = {"factor_shapes": shapes[name], "all_factors": t[f"factors/{name}"]}
        if f"patches/{name}" in t:
            entry.update(
                {
                    "conv_patches": t[f"patches/{name}"],
                    "matmul_A": t[f"matmul_A/{name}"],
                    "previous_extract_patches": t[f"old_patches/{name}"],
                    "previous_einsum_A": t[f"old_einsum_A/{name}"],
                    "relative_difference_to_previous_A": differences[name],
                }
            )
        out["factors_ms"][name] = entry
    out["factors_ms"]["all layers"] = t["factors/all layers"]
    for name in inversion_names:
        out["inversion_ms"][name] = {
            "per-particle eigh (float64)": t[f"inv_pp/{name}"],
            "mean only eigh (float64)": t[f"inv_mean/{name}"],
        }
    out["inversion_ms"]["whole invert, mean only (average mode), all layers, with assigns"] = t[
        "inv_all_mean"
    ]
    out["inversion_ms"]["whole invert, per-particle + mean, all layers, with assigns"] = t[
        "inv_all_full"
    ]
    out["direction_ms"] = {k: t[f"dir/{k}"] for k in directions}
    log("  microbenchmarks done")
    return out


def lenet_markdown(training, timing, micro):
    lines = [
        f"### (a) Training check: LeNet-5, N = {PARTICLES}, batch {BATCH}, seed 0",
        "",
        "| method | lr | epochs | test accuracy | test NLL | fit s | skipped steps (model / curvature) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in training:
        lines.append(
            f"| {r['method']} | {r['learning_rate']:g} | {len(r['train_nll_per_epoch'])} | "
            f"{r['accuracy']:.4f} | {r['nll']:.4f} | {r['fit_seconds']:.1f} | "
            f"{r['skipped_steps']} / {r['skipped_curvature_steps']} |"
        )
    if timing:
        row = timing["rows"][0]
        ratio = row["ratios"]["matrix_svgd/svgd"]
        lines += [
            "",
            f"### (b) Step time (paired, interleaved; {timing['settings']['rounds']} rounds of "
            f"{timing['settings']['steps_per_block']}-step blocks)",
            "",
            "| variant | what | ms / step (median) | paired ratio to svgd |",
            "|---|---|---|---|",
        ]
        for k, meta in timing["variants"].items():
            lines.append(
                f"| ({meta['letter']}) {k} | {meta['description']} | {timing['ms_per_step'][k]:.2f} | "
                f"{timing['ratio_to_svgd'][k]:.2f} |"
            )
        lines += [
            "",
            f"**Acceptance MatrixSVGD(average, KFAC(inversion_period=20, factor_period=20)) / SVGD "
            f"<= 1.5: ratio {ratio:.2f} -> "
            f"{'PASS' if ratio <= 1.5 else 'FAIL'}** (ratio of medians "
            f"{row['ratios_of_medians']['matrix_svgd/svgd']:.2f}, of minima "
            f"{row['ratios_of_minima']['matrix_svgd/svgd']:.2f}). Skipped steps during timing: "
            + ", ".join(f"{k} {v['model']}/{v['curvature']}" for k, v in timing["skipped"].items())
            + ".",
            "",
            "### (c) Profile: paired differences (median over rounds of the within-round difference)",
            "",
            "| piece | ms / step |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v:.2f} |" for k, v in timing["paired_pieces_ms"].items()]
    if micro:
        lines += [
            "",
            "Op-level microbenchmarks (compiled tf.function, median ms; one LeNet batch of 64, N = 10). "
            "Conv layers: the library's patches (one gather of the padded pixels) and A (particle-major matmul), and the "
            "previous ops (tf.image.extract_patches, einsum) for comparison:",
            "",
            "| layer | factor shapes | all factors ms | patches ms (previous) | A ms (previous einsum) | "
            "max rel. difference of A to previous |",
            "|---|---|---|---|---|---|",
        ]
        for name, e in micro["factors_ms"].items():
            if isinstance(e, dict):
                conv = "conv_patches" in e
                lines.append(
                    f"| {name} | {e['factor_shapes']} | {e['all_factors']:.2f} | "
                    + (
                        f"{e['conv_patches']:.2f} ({e['previous_extract_patches']:.2f}) | {e['matmul_A']:.2f} "
                        f"({e['previous_einsum_A']:.2f}) | {e['relative_difference_to_previous_A']:.2g} |"
                        if conv
                        else "- | - | - |"
                    )
                )
        lines.append(f"| all layers | | {micro['factors_ms']['all layers']:.2f} | | | |")
        lines += [
            "",
            "| inversion block | per-particle eigh ms | mean-only eigh ms |",
            "|---|---|---|",
        ]
        for name, e in micro["inversion_ms"].items():
            if isinstance(e, dict):
                lines.append(
                    f"| {name} | {e['per-particle eigh (float64)']:.2f} | "
                    f"{e['mean only eigh (float64)']:.2f} |"
                )
            else:
                lines.append(f"| {name} | {e:.2f} | |")
        lines += ["", "| direction | ms |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in micro["direction_ms"].items()]
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------------------
GRU_NOTE = (
    "Method: bk.zoo.gru_classifier (GRU(32) -> Dense(10), every weight a particle, N = 10, N(0, 1) prior) "
    "on the 8x8 digits read as 8 time steps of 8 pixels, trained through model.fit (batch 64) on the library's "
    "stratified split (bk.datasets.load_digits, 1,347 train / 450 test). Learning rates chosen per method on "
    "the grid below by the validation NLL after the last epoch (fit on 75% of the training split, validate on "
    "the other 25%, stratified, seed 0); the chosen configuration is then retrained on the whole training "
    "split with each seed and scored on the test split (error and NLL of the particle-averaged predictive; "
    "mean ± std over seeds). Vanilla SVGD uses its library default step rule (dimension-wise RMSProp), "
    "MatrixSVGD its default (SGD: a diagonal adaptive rule after KFAC would partly undo the preconditioning). "
    "KFAC: empirical Fisher, damping 1e-3 + prior precision 1 (pi-split), EMA 0.95 per statistics update. "
    "T_inv = KFAC inversion period (5: the authors' small-data setting; 20: the library default), every KFAC "
    "run inverting on each of its first T_inv steps (warm-up); T_f = factor period (statistics every T_f steps "
    "after the warm-up; 1 where not named). Mixture entropy: mean entropy of "
    "the mixture weights after the last step (log 10 = 2.30 would be uniform; 0 = one-hot, i.e. per-particle "
    "natural-gradient steps with no repulsion)."
)
GRU_WARMUP_CHECK = (
    "Note (2026-11-23): this part was rerun after KFAC's warm-up fix (inversion on each of the first T_inv "
    "steps; before, the first inverse came from ONE minibatch and was kept for T_inv steps). Against the "
    "previous run's 3-seed table the MatrixSVGD NLLs moved (e.g. average T_inv=5: 0.063 ± 0.003 -> "
    "0.101 ± 0.042), within seed noise: a separate 6-seed check (seeds 0-5, the chosen learning rates, full "
    "training split) of the new vs the old schedule gave test NLL average T_inv=5 0.085 ± 0.035 vs "
    "0.100 ± 0.050, average T_inv=20 0.147 ± 0.065 vs 0.148 ± 0.088, mixture T_inv=5 0.100 ± 0.038 vs "
    "0.103 ± 0.039 (errors 0.011-0.013 for all). The NLL of 20-epoch runs is heavy-tailed over seeds; three "
    "seeds do not rank these methods."
)
LENET_NOTE = (
    "Method (b), (c): every variant runs its own compiled train function (`model.train_function(iterator)` on a "
    "persistent tf.data iterator repeating one fixed batch of 64 digits: what fit executes per step), built, "
    "traced and run past KFAC's warm-up first (20 steps of statistics + inversion); then per round every variant "
    "runs one block of consecutive steps, back to back in shuffled order (benchmarks/step_time.py's "
    "Group.visit), blocks as long as the inversion period so every MatrixSVGD block holds exactly one inversion "
    "(and, with factor_period=20, one statistics update). Times are medians over rounds of block time / steps; "
    "ratios and differences are medians over rounds of the within-round ratio / difference (paired: slow phases "
    "of the shared machine cancel). Learning rate 1e-4 for every timed variant (a diverged run skips its updates "
    "and would time a cheaper step; the skipped counters above must be 0). Profile variants add one piece at a "
    "time: svgd_sgd (vanilla SVGD, plain SGD like MatrixSVGD) -> capture (the model captures layer inputs and "
    "differentiates w.r.t. pre-activations) -> factors (+ KFAC factors of each batch and their EMA, every step) "
    "-> no_inversion (+ the Q-metric kernel and Q_bar^-1 on the mean factors; never inverted) -> "
    "inversion_every_step (+ one mean-only inversion per step, what the average mode computes) / "
    "full_inversion_every_step (+ per-particle inversions as well, what the library did before the average mode "
    "declared its curvature_operators). matrix_svgd_factor_every_step ~ no_inversion + one mean inversion / 20; "
    "matrix_svgd (the acceptance configuration) ~ (capture + factors + mean inversion) / 20 + the Q-metric "
    "kernel. KFAC's factors use the library's sliced conv patches and particle-major matmuls (op table)."
)


def _md_run(run):
    if not run:
        return []
    return [
        f"Run: `{run['command']}`, {run['date']}, load average at start {run['load_average_at_start']}, "
        f"{run['seconds']:.0f} s.",
        "",
    ]


def write_results(args, result):
    """Writes the .json and the .md of `result` (both parts where present; a one-part run merges in the other
    part from the existing .json)."""
    os.makedirs(args.out, exist_ok=True)
    stem = "svgd_digits_quick" if args.quick else "svgd_digits"
    path = os.path.join(args.out, stem + ".json")
    if args.part != "all" and os.path.exists(path):
        with open(path) as f:
            previous = json.load(f)
        other = "lenet" if args.part == "gru" else "gru"
        if other in previous:
            result[other] = previous[other]
            if "run" not in result[other]:  # written before the per-part provenance: the run's own
                result[other]["run"] = {
                    "command": previous.get("settings", {}).get("command"),
                    "date": previous.get("machine", {}).get("date"),
                    "load_average_at_start": previous.get("timing", {}).get(
                        "load_average_at_start"
                    ),
                    "seconds": result[other].get("seconds", float("nan")),
                }
    harness.save_results(stem, result, render_markdown(result), args.out, indent=1, default=str)
    return stem


def render_markdown(result):
    m = result["machine"]
    device = f"GPUs {m['gpus']}" if m["gpus"] else "no GPU"
    lines = [
        "# Matrix-valued-kernel SVGD (KFAC) vs vanilla SVGD on digits: GRU error, LeNet-5 step time",
        "",
        f"Machine: {m['cpu_count']} CPU cores ({m['processor']}), {device}; TensorFlow {m['tensorflow']}, "
        f"Keras {m['keras']}, TFP {m['tensorflow_probability']}.",
        "",
    ]
    if "gru" in result:
        gru = result["gru"]
        table, grid = gru_tables(gru)
        epochs = len(gru["final"]["vanilla"][0]["train_nll_per_epoch"])
        seeds = [r["seed"] for r in gru["final"]["vanilla"]]
        lines += [
            f"## 1. GRU on digit rows (N = {PARTICLES}, {UNITS} units, {epochs} epochs, seeds {seeds})",
            "",
            *_md_run(gru.get("run")),
            table,
            "",
            GRU_NOTE,
            "",
            GRU_WARMUP_CHECK,
            "",
            f"Learning-rate grid (validation split, seed {gru.get('tune_seed', 0)}):",
            "",
            grid,
            "",
        ]
    if "lenet" in result:
        lenet = result["lenet"]
        lines += [
            "## 2. LeNet-5 with MatrixSVGD(average, KFAC(inversion_period=20, factor_period=20))",
            "",
            *_md_run(lenet.get("run")),
            lenet_markdown(lenet["training"], lenet["timing"], lenet["microbenchmarks"]),
            "",
            LENET_NOTE,
            "",
        ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("all", "gru", "lenet"), default="all")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 seed, few epochs, one lr per method"
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=None, help=f"final seeds (default {list(SEEDS)})"
    )
    parser.add_argument("--tune-seed", type=int, default=0)
    parser.add_argument(
        "--epochs", type=int, default=None, help=f"GRU epochs (default {EPOCHS}; quick 3)"
    )
    parser.add_argument(
        "--lenet-epochs",
        type=int,
        default=None,
        help=f"LeNet epochs (default {LENET_EPOCHS}; quick 2)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="timing rounds (default 15; quick 4)"
    )
    parser.add_argument(
        "--steps", type=int, default=20, help="steps per timed block (default 20 = T_inv)"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-micro", action="store_true", help="skip the op-level microbenchmarks")
    parser.add_argument("--seed", type=int, default=0, help="seed of the timing order")
    parser.add_argument("--out", default=RESULTS_DIR)
    parser.add_argument(
        "--render", action="store_true", help="only rewrite the .md from the existing .json"
    )
    args = parser.parse_args(argv)
    if args.render:
        stem = "svgd_digits_quick" if args.quick else "svgd_digits"
        with open(os.path.join(args.out, stem + ".json")) as f:
            text = render_markdown(json.load(f))
        with open(os.path.join(args.out, stem + ".md"), "w") as f:
            f.write(text)
        return
    args.seeds = args.seeds or ([0] if args.quick else list(SEEDS))
    args.epochs = args.epochs or (3 if args.quick else EPOCHS)
    args.lenet_epochs = args.lenet_epochs or (2 if args.quick else LENET_EPOCHS)
    args.rounds = args.rounds or (4 if args.quick else 15)

    t_start = time.perf_counter()
    load_at_start = harness.load_average()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.0f} s] {msg}", flush=True)

    result = {
        "settings": {
            "particles": PARTICLES,
            "batch_size": BATCH,
            "gru_units": UNITS,
            "gru_epochs": args.epochs,
            "lenet_epochs": args.lenet_epochs,
            "seeds": args.seeds,
            "tune_seed": args.tune_seed,
            "quick": args.quick,
            "part": args.part,
            "command": " ".join(
                ["python", "benchmarks/svgd_digits.py"]
                + (sys.argv[1:] if argv is None else list(argv))
            ),
        }
    }
    command = result["settings"]["command"]

    def provenance(t0):
        return {
            "command": command,
            "date": harness.machine_info()["date"],
            "load_average_at_start": harness.load_average(),
            "seconds": time.perf_counter() - t0,
        }

    if args.part in ("all", "gru"):
        log("Part 1: GRU on digit rows")
        t0, load = time.perf_counter(), harness.load_average()
        result["gru"] = run_gru(args, log)
        result["gru"]["seconds"] = time.perf_counter() - t0
        result["gru"]["tune_seed"] = args.tune_seed
        result["gru"]["run"] = {**provenance(t0), "load_average_at_start": load}
        print("\n" + gru_tables(result["gru"])[0] + "\n", flush=True)
    if args.part in ("all", "lenet"):
        log("Part 2: LeNet-5")
        t0, load = time.perf_counter(), harness.load_average()
        training = run_lenet_training(args, log)
        timing = run_lenet_timing(args, log)
        micro = None if args.no_micro else run_microbenchmarks(args, log)
        result["lenet"] = {
            "training": training,
            "timing": timing,
            "microbenchmarks": micro,
            "seconds": time.perf_counter() - t0,
        }
        result["lenet"]["run"] = {**provenance(t0), "load_average_at_start": load}
        ratio = timing["rows"][0]["ratios"]["matrix_svgd/svgd"]
        result["lenet"]["target"] = {
            "name": "MatrixSVGD(average, KFAC(inversion_period=20, factor_period=20)) / "
            "SVGD step time <= 1.5 (LeNet-5, N=10, batch 64)",
            "ratio": ratio,
            "pass": bool(ratio <= 1.5),
        }
        print("\n" + lenet_markdown(training, timing, micro) + "\n", flush=True)
    result["machine"] = harness.machine_info()
    result["timing"] = {
        "load_average_at_start": load_at_start,
        "total_s": time.perf_counter() - t_start,
    }
    stem = write_results(args, result)
    log(f"Wrote {args.out}/{stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
    gc.freeze()  # skip the slow garbage collection of the traced models at exit
