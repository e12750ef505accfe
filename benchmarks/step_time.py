"""Seconds per training step: bayes_keras particles vs. N separate Keras models vs. tfp Flipout VI.

What is measured: the wall-clock time of ONE optimisation step (forward, backward, optimizer update,
metric bookkeeping) on a fixed batch of 64 scikit-learn digits, for

  (a) bk_ensemble   BayesianModel with N particles + bk.optimizers.IndependentParticles(1e-3)
  (b) keras_loop    N separate plain Keras 3 models, each with Adam(1e-3), stepped one after
                    another (the time reported is one step of ALL N models)
  (c) keras_single  one plain Keras 3 model with Adam(1e-3)
  (d) bk_gpf        BayesianModel with N particles + GaussianParticleFlow(1e-2, structure="full")
  (e) tfp_flipout   the same architecture from tfp.layers Flipout layers in a tf_keras (Keras 2)
                    model: mean-field VI, one weight sample per step, KL / dataset_size added as
                    layer losses, Adam(1e-3)
  (f) keras_batched one plain Keras 3 model with Adam(1e-3) stepped on N copies of the batch: the
                    arithmetic of N particles in Keras' most efficient form, a floor for (a)

for an MLP (64 -> 50 -> 50 -> 10, relu, flattened digits) and LeNet-5 (8x8x1 digits), N in {5, 10, 20}.
(c) and (e) do not depend on N.

How: every variant is built, compiled (default settings: on a CPU-only machine Keras disables
XLA for all of them) and warmed up (tracing excluded). Each variant is then driven by its OWN
compiled train function:
  --driver fit (default): the way `fit` drives it, `model.train_function(iterator)` on a persistent
      tf.data iterator that repeats the fixed batch (no per-call data-adapter cost);
  --driver train_on_batch: `model.train_on_batch(xb, yb)`, which adds each framework's per-call
      overhead (tf_keras builds a one-batch tf.data pipeline on every call).
Timing is interleaved and paired. The variants compared in one table row, i.e. (a), (b), (c), (d)
and (e) for one (architecture, N), form a group. In every round each group is visited once (groups in
shuffled order) and each of its variants runs a block of `--steps` consecutive steps, back to back in
shuffled order, so the six blocks of a visit see the same machine state (on a shared 2-core machine
the speed can jump by 1.5x when another process takes a core). A block's per-step time is its wall
time / steps. Reported: the median per-step time of every variant over `--rounds` rounds, and every
ratio as the median over rounds of the ratio WITHIN a visit (paired), which cancels slow machine
phases that a ratio of independent medians would not. (c) and (e) are the same models in every
row of an architecture; they are simply timed once per visit.

Usage:
    python benchmarks/step_time.py            # full run (a few minutes on 2 CPU cores)
    python benchmarks/step_time.py --quick    # ~1 minute smoke run
Writes benchmarks/results/step_time.{json,md} (driver fit) or step_time_train_on_batch.{json,md};
with TF_ENABLE_ONEDNN_OPTS set, the stem gains _onednn_on / _onednn_off.
"""

import argparse
import gc
import os
import random
import statistics
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

# tfp.layers on tf_keras warn about deprecated add_variable and unseeded initializers: noise here.
warnings.filterwarnings("ignore", message=".*add_variable.*is deprecated", category=UserWarning)
warnings.filterwarnings("ignore", message="The initializer .* is unseeded", category=UserWarning)

# Every model's train function is traced exactly once, but TF counts traces across the ~80 models
# built here and warns about "retracing"; silence that (checked: no function retraces while timed).
tf.get_logger().setLevel("ERROR")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bayes_keras as bk  # noqa: E402
import harness  # noqa: E402

RESULTS_DIR = harness.RESULTS_DIR
BATCH_SIZE = 64
ARCHS = ("mlp", "lenet5")
VARIANTS = {  # key -> (letter, description)
    "bk_ensemble": ("a", "bayes_keras, N particles, IndependentParticles(1e-3)"),
    "keras_loop": ("b", "N separate Keras models, Adam, stepped one after another"),
    "keras_single": ("c", "one Keras model, Adam"),
    "bk_gpf": ("d", "bayes_keras, N particles, GaussianParticleFlow(1e-2, 'full')"),
    "tfp_flipout": ("e", "tfp Flipout (mean-field VI, 1 sample) in tf_keras, Adam"),
    "keras_batched": (
        "f",
        "one Keras model, Adam, on N copies of the batch (N x 64 examples): the arithmetic "
        "of N particles, perfectly batched",
    ),
}
RATIOS = (
    ("a/f", "bk_ensemble", "keras_batched"),
    ("a/b", "bk_ensemble", "keras_loop"),
    ("a/e", "bk_ensemble", "tfp_flipout"),
    ("d/a", "bk_gpf", "bk_ensemble"),
    ("a/c", "bk_ensemble", "keras_single"),
    ("f/e", "keras_batched", "tfp_flipout"),
)


# -- data ------------------------------------------------------------------------------------------
def fixed_batch(arch):
    """The first BATCH_SIZE training examples (x as float32 tensor, y as int32 tensor), and the train size."""
    (xtr, ytr), _ = bk.datasets.load_digits(image=(arch == "lenet5"))
    return tf.constant(xtr[:BATCH_SIZE]), tf.constant(ytr[:BATCH_SIZE]), len(xtr)


# -- models ----------------------------------------------------------------------------------------
def bayesian_model(arch, n, optimizer, dataset_size):
    if arch == "mlp":
        model = bk.zoo.mlp(64, 10, (50, 50), num_particles=n, likelihood="categorical")
    else:
        model = bk.zoo.lenet5((8, 8, 1), 10, num_particles=n)
    model.compile(optimizer=optimizer, dataset_size=dataset_size)
    return model


def keras_model(arch):
    model = (
        bk.zoo.keras_mlp(64, 10, (50, 50)) if arch == "mlp" else bk.zoo.keras_lenet5((8, 8, 1), 10)
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def flipout_model(arch, dataset_size):
    """Mean-field Gaussian VI with Flipout (tfp.layers, legacy tf_keras): the same architecture."""
    import tensorflow_probability as tfp
    import tf_keras

    tfpl, tfd = tfp.layers, tfp.distributions

    def kl(q, p, _):  # the ELBO's KL term per training example
        return tfd.kl_divergence(q, p) / float(dataset_size)

    if arch == "mlp":
        layers = [
            tf_keras.Input((64,)),
            tfpl.DenseFlipout(50, activation="relu", kernel_divergence_fn=kl),
            tfpl.DenseFlipout(50, activation="relu", kernel_divergence_fn=kl),
            tfpl.DenseFlipout(10, kernel_divergence_fn=kl),
        ]
    else:
        layers = [
            tf_keras.Input((8, 8, 1)),
            tfpl.Convolution2DFlipout(
                6, 5, padding="same", activation="relu", kernel_divergence_fn=kl
            ),
            tf_keras.layers.MaxPooling2D(2),
            tfpl.Convolution2DFlipout(
                16, 5, padding="same", activation="relu", kernel_divergence_fn=kl
            ),
            tf_keras.layers.MaxPooling2D(2),
            tf_keras.layers.Flatten(),
            tfpl.DenseFlipout(120, activation="relu", kernel_divergence_fn=kl),
            tfpl.DenseFlipout(84, activation="relu", kernel_divergence_fn=kl),
            tfpl.DenseFlipout(10, kernel_divergence_fn=kl),
        ]
    model = tf_keras.Sequential(layers)
    # tf_keras adds model.losses (the layers' KL terms) to the compiled loss.
    model.compile(
        optimizer=tf_keras.optimizers.Adam(1e-3),
        loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


# -- drivers ---------------------------------------------------------------------------------------
def make_stepper(model, x, y, driver, iterator):
    """A zero-argument callable that runs one compiled training step of `model` on (x, y)."""
    if driver == "train_on_batch":
        return lambda: model.train_on_batch(x, y)
    # What fit does per step: the compiled train function pulls the next batch from a tf.data
    # iterator. One iterator (repeating the fixed batch) is shared by all models of an architecture:
    # TF takes ~0.3 s to destroy each tf.data iterator, so one per model would slow the exit by minutes.
    model.make_train_function()
    train_function = model.train_function
    return lambda: train_function(iterator)


class Variant:
    """One thing to time: a list of compiled steppers run one after another per step."""

    def __init__(self, arch, key, n, models, steppers):
        self.arch, self.key, self.n = arch, key, n
        self.steppers = steppers  # keras_loop holds N of them; every other variant one
        self.jit_compile = any(bool(getattr(m, "jit_compile", False)) for m in models)
        self.samples = []  # seconds per step, one entry per timed block

    @property
    def name(self):
        return f"{self.arch}/{self.key}/N={self.n or 'any'}"

    def step(self):
        logs = None
        for s in self.steppers:
            logs = s()
        return logs

    def time_block(self, steps):
        t0 = time.perf_counter()
        for _ in range(steps):
            logs = self.step()
        harness.sync(logs)
        seconds = (time.perf_counter() - t0) / steps
        self.samples.append(seconds)
        return seconds


class Group:
    """The six variants of one table row (architecture, N) and their per-visit timings."""

    def __init__(self, arch, n, members):
        self.arch, self.n, self.members = arch, n, members  # members: variant key -> Variant
        self.visits = []  # one {variant key: seconds per step} per round

    def visit(self, steps, rng):
        keys = list(self.members)
        rng.shuffle(keys)
        self.visits.append({k: self.members[k].time_block(steps) for k in keys})


def tiled_batch(x, y, n):
    """N copies of the batch, and an iterator repeating them (for the perfectly batched reference)."""
    xt, yt = tf.tile(x, [n] + [1] * (len(x.shape) - 1)), tf.tile(y, [n])
    return xt, yt, iter(tf.data.Dataset.from_tensors((xt, yt)).repeat())


def build_groups(archs, ns, driver, warmup):
    groups, variants = [], []
    for arch in archs:
        x, y, dataset_size = fixed_batch(arch)
        iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())

        def make(key, n, models, data=None):
            xd, yd, it = (x, y, iterator) if data is None else data
            v = Variant(arch, key, n, models, [make_stepper(m, xd, yd, driver, it) for m in models])
            for _ in range(warmup + 1):  # the first call traces; a few more settle caches
                harness.sync(v.step())
            variants.append(v)
            print(f"  built {v.name}", flush=True)
            return v

        single = make("keras_single", None, [keras_model(arch)])
        flipout = make("tfp_flipout", None, [flipout_model(arch, dataset_size)])
        # (b): N_max separate models; the variant for N steps the first N of them.
        loop_models = [keras_model(arch) for _ in range(max(ns))]
        for n in ns:
            members = {
                "bk_ensemble": make(
                    "bk_ensemble",
                    n,
                    [
                        bayesian_model(
                            arch, n, bk.optimizers.IndependentParticles(1e-3), dataset_size
                        )
                    ],
                ),
                "keras_loop": make("keras_loop", n, loop_models[:n]),
                "keras_single": single,
                "bk_gpf": make(
                    "bk_gpf",
                    n,
                    [
                        bayesian_model(
                            arch,
                            n,
                            bk.optimizers.GaussianParticleFlow(
                                1e-2, structure="full", step_rule="rmsprop"
                            ),
                            dataset_size,
                        )
                    ],
                ),
                "tfp_flipout": flipout,
                "keras_batched": make(
                    "keras_batched", n, [keras_model(arch)], data=tiled_batch(x, y, n)
                ),
            }
            groups.append(Group(arch, n, members))
    return groups, variants


# -- reporting -------------------------------------------------------------------------------------
def summarise(groups, variants=VARIANTS, ratios=RATIOS):
    """Per row: median and minimum seconds per step of every variant, and every ratio as the median of
    the per-visit (paired) ratios, plus ratios of medians and of minima."""
    rows = []
    for g in groups:
        per_key = {k: [v[k] for v in g.visits] for k in variants}
        rows.append(
            {
                "model": g.arch,
                "N": g.n,
                "seconds_per_step": {k: statistics.median(t) for k, t in per_key.items()},
                "min_seconds_per_step": {k: min(t) for k, t in per_key.items()},
                # paired: the ratio within each visit, then the median over visits
                "ratios": {
                    name: statistics.median(v[num] / v[den] for v in g.visits)
                    for name, num, den in ratios
                },
                "ratios_of_medians": {
                    name: statistics.median(per_key[num]) / statistics.median(per_key[den])
                    for name, num, den in ratios
                },
                "ratios_of_minima": {
                    name: min(per_key[num]) / min(per_key[den]) for name, num, den in ratios
                },
            }
        )
    return rows


def markdown_table(rows, variants=VARIANTS, ratios=RATIOS, extra_columns=()):
    """`extra_columns`: (header, row -> cell text) pairs appended after the ratios."""
    head = (
        ["model", "N"]
        + [f"({variants[k][0]}) {k} ms" for k in variants]
        + [r[0] for r in ratios]
        + [h for h, _ in extra_columns]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], str(r["N"])]
        cells += [f"{1e3 * r['seconds_per_step'][k]:.2f}" for k in variants]
        cells += [f"{r['ratios'][name]:.2f}" for name, _, _ in ratios]
        cells += [cell(r) for _, cell in extra_columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_rounds(groups, rounds, steps, seed, t_start):
    """Interleaved timing: every round visits every group once, groups in shuffled order."""
    rng = random.Random(seed)
    for r in range(rounds):
        for g in rng.sample(groups, len(groups)):
            g.visit(steps, rng)
        print(f"  round {r + 1}/{rounds} done ({time.perf_counter() - t_start:.0f} s)", flush=True)


def targets(rows):
    """The acceptance targets, evaluated on the (paired) ratios: {name: {"ratio": r, "pass": bool}}."""
    out = {}

    def check(name, ratio, ok):
        out[name] = {"ratio": round(ratio, 4), "pass": bool(ok)}

    for r in rows:
        tag, q = f"{r['model']}/N={r['N']}", r["ratios"]
        if r["N"] == 10:
            check(f"a <= 1.2 f ({tag})", q["a/f"], q["a/f"] <= 1.2)
            check(f"a <= 0.3 b ({tag})", q["a/b"], q["a/b"] <= 0.3)
        check(f"d <= 1.05 a ({tag})", q["d/a"], q["d/a"] <= 1.05)
    return out


def method_note(args):
    if args.driver == "fit":
        driver = (
            "`model.train_function(iterator)` on a persistent tf.data iterator repeating one fixed batch, i.e. "
            "what `fit` executes per step (`train_on_batch` would instead charge tf_keras (e) for building a "
            "one-batch tf.data pipeline on every call)"
        )
    else:
        driver = "`model.train_on_batch(xb, yb)` on one fixed batch, including each framework's per-call overhead"
    return (
        f"Method: every variant runs its own compiled train step, driven by {driver}, on a fixed batch of "
        f"{BATCH_SIZE} scikit-learn digits, after a tracing step and {args.warmup} warm-up steps. The six variants "
        f"of a row are timed back to back in shuffled order, {args.steps} consecutive steps each, once per round, "
        f"for {args.rounds} rounds (rows visited in shuffled order). Times are medians over rounds of block time / "
        "steps; ratios are medians over rounds of the ratio within a round (paired, so that phases in which "
        "another process slows the shared machine cancel); the JSON also has ratios of medians and minima. "
        "(b) is the time to step all N separate Keras models once each; (c) and (e) do not depend on N (the same "
        "models are re-timed in every row). All Keras 3 models use default compile settings (Keras turns XLA "
        "off on CPU-only machines); (e) is tf_keras (Keras 2) with tfp.layers Flipout layers and KL / dataset_size "
        "as layer losses. a/b < 1: the particle ensemble is faster than looping over N Keras models; d/a: the "
        "cost of GPF relative to independent particles. (f) is a floor for (a): the same arithmetic as N "
        "particles in the most efficient form Keras has (one model, one N-times-larger batch); f/e >= 1 means "
        "that no implementation of N particles can step faster than Flipout's single weight sample here."
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved timing rounds (default 40; quick 6)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per timed block (default 10; quick 5)"
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed steps per variant after the tracing step"
    )
    parser.add_argument(
        "--particles", type=int, nargs="+", default=None, help="values of N (default 5 10 20)"
    )
    parser.add_argument("--models", nargs="+", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--driver", choices=("fit", "train_on_batch"), default="fit")
    parser.add_argument(
        "--quick", action="store_true", help="~1 minute smoke run (fewer rounds/steps)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=RESULTS_DIR, help="results directory")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (6 if args.quick else 40)
    args.steps = args.steps or (5 if args.quick else 10)
    ns = args.particles or [5, 10, 20]

    keras.utils.set_random_seed(args.seed)
    load_at_start = harness.load_average()
    t_start = time.perf_counter()
    print(f"Building and warming up variants (driver={args.driver}) ...", flush=True)
    groups, variants = build_groups(args.models, ns, args.driver, args.warmup)
    t_built = time.perf_counter()

    run_rounds(groups, args.rounds, args.steps, args.seed, t_start)

    rows = summarise(groups)
    table = markdown_table(rows)
    checks = targets(rows)
    print("\n" + table + "\n")
    for name, c in checks.items():
        print(f"  {'PASS' if c['pass'] else 'FAIL'}  {name}: {c['ratio']:.3f}")

    command = " ".join(
        ["python", "benchmarks/step_time.py"] + (sys.argv[1:] if argv is None else list(argv))
    )
    result = {
        "description": (
            "seconds per training step: median over interleaved rounds; ratios are medians of "
            "per-round paired ratios"
        ),
        "settings": {
            "batch_size": BATCH_SIZE,
            "rounds": args.rounds,
            "steps_per_block": args.steps,
            "warmup_steps": args.warmup,
            "particles": ns,
            "models": args.models,
            "driver": args.driver,
            "seed": args.seed,
            "quick": args.quick,
            "command": command,
        },
        "variants": {
            k: {"letter": letter, "description": d} for k, (letter, d) in VARIANTS.items()
        },
        "jit_compile": {v.name: v.jit_compile for v in variants},
        "rows": rows,
        # every block of every variant (keras_single / tfp_flipout are timed in every group visit)
        "median_seconds_per_step_all_blocks": {
            v.name: statistics.median(v.samples) for v in variants
        },
        "raw_seconds_per_step": {v.name: v.samples for v in variants},
        "raw_visits": [{"model": g.arch, "N": g.n, "visits": g.visits} for g in groups],
        "targets": checks,
        "machine": harness.machine_info(),
        "timing": {
            "load_average_at_start": load_at_start,
            "build_and_warmup_s": t_built - t_start,
            "total_s": time.perf_counter() - t_start,
        },
    }
    stem = write_results(args, result, table)
    print(
        f"\nWrote {args.out}/{stem}.json and {stem}.md ({time.perf_counter() - t_start:.0f} s total)"
    )


_LIBRARY_NAMES = {
    "tensorflow": "TensorFlow",
    "keras": "Keras",
    "tf_keras": "tf_keras",
    "tensorflow_probability": "TFP",
}


def write_report(
    out,
    stem,
    result,
    title,
    variants_line,
    table,
    note,
    libraries=("tensorflow", "keras", "tensorflow_probability"),
    machine_extra="",
):
    """Write `result` as out/stem.json and a markdown report out/stem.md (shared by the step-time benchmarks)."""
    m = result["machine"]
    device = f"GPUs {m['gpus']}" if m["gpus"] else "no GPU"
    libs = ", ".join(f"{_LIBRARY_NAMES[k]} {m[k]}" for k in libraries)
    lines = [
        f"# {title}",
        "",
        f"Machine: {m['cpu_count']} CPU cores ({m['processor']}), {device}; {libs}; {m['date']}; "
        f"load average at start {result['timing']['load_average_at_start']}; oneDNN "
        f"{m.get('onednn', 'default')} (TF_ENABLE_ONEDNN_OPTS){machine_extra}.",
        "",
        variants_line,
        "",
        table,
        "",
        note,
        "",
        "Targets (paired ratio): "
        + "; ".join(
            f"{name}: {c['ratio']:.3f} {'pass' if c['pass'] else 'FAIL'}"
            for name, c in result["targets"].items()
        )
        + ".",
        "",
        f"Command: `{result['settings']['command']}`",
    ]
    harness.save_results(stem, result, lines, out)


def write_results(args, result, table):
    stem = "step_time" if args.driver == "fit" else f"step_time_{args.driver}"
    if harness.onednn_setting() != "default":
        stem += f"_onednn_{harness.onednn_setting()}"
    write_report(
        args.out,
        stem,
        result,
        "Seconds per training step: particles vs. separate models vs. Flipout VI",
        "Milliseconds per step (median). Variants: "
        + "; ".join(f"({letter}) {k}: {d}" for k, (letter, d) in VARIANTS.items())
        + ".",
        table,
        method_note(args),
        libraries=("tensorflow", "keras", "tf_keras", "tensorflow_probability"),
    )
    return stem


if __name__ == "__main__":
    main()
    # Everything is written. Python's garbage collector would otherwise spend ~30 s at interpreter
    # shutdown walking the object graphs of the ~80 traced models; freeze them instead.
    gc.freeze()
