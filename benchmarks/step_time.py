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

for an MLP (64 -> 50 -> 50 -> 10, relu, flattened digits) and LeNet-5 (8x8x1 digits), N in {5, 10, 20}.
(c) and (e) do not depend on N; they are timed once per architecture.

How: every variant is built, compiled (default settings: on a CPU-only machine Keras disables
XLA for all of them) and warmed up (tracing excluded). Each variant is then driven by its OWN
compiled train function:
  --driver fit (default): the way `fit` drives it, `model.train_function(iterator)` on a persistent
      tf.data iterator that repeats the fixed batch (no per-call data-adapter cost);
  --driver train_on_batch: `model.train_on_batch(xb, yb)`, which adds each framework's per-call
      overhead (tf_keras builds a one-batch tf.data pipeline on every call).
Timing is interleaved: in every round, every variant of every (architecture, N) runs a block of
`--steps` consecutive steps (order shuffled per round with a fixed seed), so machine noise hits all
variants alike. The per-step time of a block is its wall time / steps; the reported figure is the
median over `--rounds` rounds. Ratios are formed from those medians.

Usage:
    python benchmarks/step_time.py            # full run (a few minutes on 2 CPU cores)
    python benchmarks/step_time.py --quick    # ~1 minute smoke run
Writes benchmarks/results/step_time.json and benchmarks/results/step_time.md.
"""

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bayes_keras as bk  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BATCH_SIZE = 64
ARCHS = ("mlp", "lenet5")
VARIANTS = {  # key -> (letter, description)
    "bk_ensemble": ("a", "bayes_keras, N particles, IndependentParticles(1e-3)"),
    "keras_loop": ("b", "N separate Keras models, Adam, stepped one after another"),
    "keras_single": ("c", "one Keras model, Adam"),
    "bk_gpf": ("d", "bayes_keras, N particles, GaussianParticleFlow(1e-2, 'full')"),
    "tfp_flipout": ("e", "tfp Flipout (mean-field VI, 1 sample) in tf_keras, Adam"),
}
RATIOS = (("a/b", "bk_ensemble", "keras_loop"), ("a/e", "bk_ensemble", "tfp_flipout"),
          ("d/a", "bk_gpf", "bk_ensemble"), ("a/c", "bk_ensemble", "keras_single"))


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
    model = bk.zoo.keras_mlp(64, 10, (50, 50)) if arch == "mlp" else bk.zoo.keras_lenet5((8, 8, 1), 10)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def flipout_model(arch, dataset_size):
    """Mean-field Gaussian VI with Flipout (tfp.layers, legacy tf_keras): the same architecture."""
    import tensorflow_probability as tfp
    import tf_keras

    tfpl, tfd = tfp.layers, tfp.distributions

    def kl(q, p, _):  # the ELBO's KL term per training example
        return tfd.kl_divergence(q, p) / float(dataset_size)

    if arch == "mlp":
        layers = [tf_keras.Input((64,)),
                  tfpl.DenseFlipout(50, activation="relu", kernel_divergence_fn=kl),
                  tfpl.DenseFlipout(50, activation="relu", kernel_divergence_fn=kl),
                  tfpl.DenseFlipout(10, kernel_divergence_fn=kl)]
    else:
        layers = [tf_keras.Input((8, 8, 1)),
                  tfpl.Convolution2DFlipout(6, 5, padding="same", activation="relu", kernel_divergence_fn=kl),
                  tf_keras.layers.MaxPooling2D(2),
                  tfpl.Convolution2DFlipout(16, 5, padding="same", activation="relu", kernel_divergence_fn=kl),
                  tf_keras.layers.MaxPooling2D(2),
                  tf_keras.layers.Flatten(),
                  tfpl.DenseFlipout(120, activation="relu", kernel_divergence_fn=kl),
                  tfpl.DenseFlipout(84, activation="relu", kernel_divergence_fn=kl),
                  tfpl.DenseFlipout(10, kernel_divergence_fn=kl)]
    model = tf_keras.Sequential(layers)
    # tf_keras adds model.losses (the layers' KL terms) to the compiled loss.
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-3),
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
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


def _sync(logs):
    """Materialise one output so the step has certainly finished (CPU execution is synchronous anyway)."""
    while isinstance(logs, (list, tuple)) and logs:
        logs = logs[-1]
    if isinstance(logs, dict) and logs:
        logs = next(iter(logs.values()))
    if hasattr(logs, "numpy"):
        logs.numpy()


class Variant:
    def __init__(self, arch, key, n, models, steppers):
        self.arch, self.key, self.n = arch, key, n
        self.steppers = steppers  # keras_loop holds N of them; every other variant one
        self.jit_compile = any(bool(getattr(m, "jit_compile", False)) for m in models)
        self.per_step = []  # seconds per step, one entry per timed round

    def step(self):
        logs = None
        for s in self.steppers:
            logs = s()
        return logs

    def time_block(self, steps):
        t0 = time.perf_counter()
        for _ in range(steps):
            logs = self.step()
        _sync(logs)
        self.per_step.append((time.perf_counter() - t0) / steps)


def build_variants(archs, ns, driver, warmup):
    variants = []
    for arch in archs:
        x, y, dataset_size = fixed_batch(arch)
        iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())

        def add(key, n, models):
            v = Variant(arch, key, n, models, [make_stepper(m, x, y, driver, iterator) for m in models])
            for _ in range(warmup):  # the first call traces; a few more settle caches
                _sync(v.step())
            variants.append(v)
            print(f"  built {arch:6s} {key:12s} N={n if n else '-'}", flush=True)

        add("keras_single", None, [keras_model(arch)])
        add("tfp_flipout", None, [flipout_model(arch, dataset_size)])
        # (b): N_max separate models; the variant for N steps the first N of them.
        loop_models = [keras_model(arch) for _ in range(max(ns))]
        for n in ns:
            add("bk_ensemble", n, [bayesian_model(arch, n, bk.optimizers.IndependentParticles(1e-3), dataset_size)])
            add("bk_gpf", n, [bayesian_model(arch, n, bk.optimizers.GaussianParticleFlow(1e-2, structure="full"),
                                             dataset_size)])
            add("keras_loop", n, loop_models[:n])
    return variants


# -- reporting -------------------------------------------------------------------------------------
def summarise(variants, archs, ns):
    med = {}
    for v in variants:
        med.setdefault(v.arch, {}).setdefault(v.key, {})[str(v.n) if v.n else "any"] = statistics.median(v.per_step)
    rows = []
    for arch in archs:
        m = med[arch]
        for n in ns:
            t = {k: (m[k]["any"] if "any" in m[k] else m[k][str(n)]) for k in VARIANTS}
            ratios = {name: t[num] / t[den] for name, num, den in RATIOS}
            rows.append({"model": arch, "N": n, "seconds_per_step": t, "ratios": ratios})
    return med, rows


def markdown_table(rows):
    head = ["model", "N"] + [f"({VARIANTS[k][0]}) {k} ms" for k in VARIANTS] + [r[0] for r in RATIOS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], str(r["N"])]
        cells += [f"{1e3 * r['seconds_per_step'][k]:.2f}" for k in VARIANTS]
        cells += [f"{r['ratios'][name]:.2f}" for name, _, _ in RATIOS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(rows):
    """The acceptance targets, evaluated on the medians."""
    out = {}
    for r in rows:
        tag = f"{r['model']}/N={r['N']}"
        if r["N"] == 10:
            out[f"a <= 0.5 b  ({tag})"] = r["ratios"]["a/b"] <= 0.5
        out[f"a < e  ({tag})"] = r["ratios"]["a/e"] < 1.0
        out[f"d <= 1.15 a  ({tag})"] = r["ratios"]["d/a"] <= 1.15
    return out


def machine_info():
    import tensorflow_probability as tfp
    import tf_keras

    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "tf_keras": tf_keras.__version__,
        "tensorflow_probability": tfp.__version__,
        "bayes_keras": bk.__version__,
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def method_note(args):
    return (
        f"Method: each variant runs its own compiled train step (driver `{args.driver}`"
        + (": `model.train_function(iterator)` on a persistent tf.data iterator repeating one fixed batch, "
           "i.e. what `fit` executes per step" if args.driver == "fit" else
           ": `model.train_on_batch(xb, yb)` on one fixed batch, including per-call overhead")
        + f") on a fixed batch of {BATCH_SIZE} scikit-learn digits, after {args.warmup} warm-up steps that exclude "
        f"tracing. Timing is interleaved: in each of {args.rounds} rounds every variant of every (model, N) runs "
        f"{args.steps} consecutive steps, in a freshly shuffled order, and the figure shown is the median over "
        "rounds of block time / steps. (b) is the time to step all N separate Keras models once each; (c) and "
        "(e) do not depend on N and are timed once per model. All Keras 3 models run with default compile "
        "settings (XLA is off on CPU-only machines); (e) is tf_keras (Keras 2) with tfp.layers Flipout layers, "
        "KL / dataset_size as layer losses. Ratios are of medians: a/b < 1 means the particle ensemble is faster "
        "than looping over N Keras models; d/a is the extra cost of GPF over independent particles."
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 15; quick 5)")
    parser.add_argument("--steps", type=int, default=None, help="steps per timed block (default 20; quick 5)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant after tracing")
    parser.add_argument("--particles", type=int, nargs="+", default=None, help="values of N (default 5 10 20)")
    parser.add_argument("--models", nargs="+", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--driver", choices=("fit", "train_on_batch"), default="fit")
    parser.add_argument("--quick", action="store_true", help="~1 minute smoke run (fewer rounds/steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=RESULTS_DIR, help="results directory")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (5 if args.quick else 15)
    args.steps = args.steps or (5 if args.quick else 20)
    ns = args.particles or [5, 10, 20]

    keras.utils.set_random_seed(args.seed)
    t_start = time.perf_counter()
    print(f"Building and warming up variants (driver={args.driver}) ...", flush=True)
    variants = build_variants(args.models, ns, args.driver, args.warmup)
    t_built = time.perf_counter()

    order_rng = random.Random(args.seed)
    for r in range(args.rounds):
        order = list(variants)
        order_rng.shuffle(order)
        for v in order:
            v.time_block(args.steps)
        print(f"  round {r + 1}/{args.rounds} done ({time.perf_counter() - t_start:.0f} s)", flush=True)

    medians, rows = summarise(variants, args.models, ns)
    table = markdown_table(rows)
    checks = targets(rows)
    print("\n" + table + "\n")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")

    os.makedirs(args.out, exist_ok=True)
    result = {
        "description": "seconds per training step (median over interleaved rounds)",
        "settings": {"batch_size": BATCH_SIZE, "rounds": args.rounds, "steps_per_block": args.steps,
                     "warmup_steps": args.warmup, "particles": ns, "models": args.models,
                     "driver": args.driver, "seed": args.seed, "quick": args.quick,
                     "command": " ".join(["python"] + sys.argv)},
        "variants": {k: {"letter": l, "description": d} for k, (l, d) in VARIANTS.items()},
        "jit_compile": {f"{v.arch}/{v.key}/N={v.n if v.n else 'any'}": v.jit_compile for v in variants},
        "median_seconds_per_step": medians,
        "raw_seconds_per_step": {f"{v.arch}/{v.key}/N={v.n if v.n else 'any'}": v.per_step for v in variants},
        "rows": rows,
        "targets": checks,
        "machine": machine_info(),
        "timing": {"build_and_warmup_s": t_built - t_start, "total_s": time.perf_counter() - t_start},
    }
    with open(os.path.join(args.out, "step_time.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "step_time.md"), "w") as f:
        f.write("# Seconds per training step: particles vs. separate models vs. Flipout VI\n\n")
        f.write(f"Machine: {result['machine']['cpu_count']} CPU cores, no GPU "
                f"({result['machine']['processor']}); TensorFlow {tf.__version__}, Keras {keras.__version__}, "
                f"tf_keras {result['machine']['tf_keras']}, TFP {result['machine']['tensorflow_probability']}; "
                f"{result['machine']['date']}.\n\n" if not result["machine"]["gpus"] else
                f"Machine: {result['machine']['cpu_count']} CPU cores, GPUs {result['machine']['gpus']}; "
                f"TensorFlow {tf.__version__}, Keras {keras.__version__}; {result['machine']['date']}.\n\n")
        f.write("Milliseconds per step (median). Variants: "
                + "; ".join(f"({l}) {k}: {d}" for k, (l, d) in VARIANTS.items()) + ".\n\n")
        f.write(table + "\n\n")
        f.write(method_note(args) + "\n\n")
        f.write(f"Command: `{result['settings']['command']}`\n")
    print(f"\nWrote {args.out}/step_time.json and step_time.md ({time.perf_counter() - t_start:.0f} s total)")


if __name__ == "__main__":
    main()
