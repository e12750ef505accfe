"""Seconds per training step of the same model under two versions of bayes_keras, in one process.

What is measured: one compiled training step (what `fit` runs per batch) of the zoo's MLP and LeNet-5
on a fixed batch of 64 digits, N particles, for several optimizers, with the library at HEAD and at an
earlier git ref (`--before`, default the parent of HEAD). The earlier version is exported with
`git archive` and imported under another package name, so both run in this process and are timed
interleaved and paired, as in step_time.py: every round visits each (model, optimizer) once and runs a
block of `--steps` steps of each version back to back in shuffled order; the reported ratio is the
median over rounds of (this version / before) within a visit.

Usage:
    python benchmarks/compare_versions.py --before 6a7ea01
Writes benchmarks/results/compare_versions.{json,md}.
"""

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_time as st  # noqa: E402  (sets TF env / logging, puts the repo on sys.path)
import harness  # noqa: E402

import bayes_keras as bk  # noqa: E402
import tensorflow as tf  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OPTIMIZERS = {
    "ensemble": lambda lib: lib.optimizers.IndependentParticles(1e-3),
    "gpf": lambda lib: lib.optimizers.GaussianParticleFlow(1e-2, step_rule="rmsprop"),
    "svgd": lambda lib: lib.optimizers.SVGD(1e-2),
    "mean_field_vi": lambda lib: lib.optimizers.MeanFieldVI(1e-3),
    # spelled out (the defaults changed between versions: precision 1e3, mean rate 0.3); 1e-2 diverges on LeNet
    "mgvbp_empirical_fisher": lambda lib: lib.optimizers.MGVBP(
        1e-3,
        curvature="empirical_fisher",
        momentum=0.4,
        initial_precision=10.0,
        mean_learning_rate=None,
    ),
    "mgvbp": lambda lib: (
        lib.optimizers.MGVBP()
    ),  # diagonal, Stein curvature (the defaults since #31)
    # 0.1 diverged on the repeated batch: skipped (NaN) steps are nearly free and made the row meaningless
    "matrix_svgd_kfac": lambda lib: lib.optimizers.MatrixSVGD(
        0.01, lib.preconditioners.KFACPreconditioner()
    ),
}


def import_before(ref, directory):
    """bayes_keras at git `ref`, importable as `bayes_keras_before`."""
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", ref, "bayes_keras"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    package = os.path.join(directory, "bayes_keras_before")
    shutil.move(os.path.join(directory, "bayes_keras"), package)
    for root, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path) as f:
                    text = f.read()
                # the package name, and the registered-serializable package, so both versions can coexist
                text = re.sub(r"\bbayes_keras\b", "bayes_keras_before", text)
                with open(path, "w") as f:
                    f.write(text)
    sys.path.insert(0, directory)
    import bayes_keras_before

    return bayes_keras_before


def build(lib, arch, optimizer, n, x, y, iterator):
    if arch == "lenet5":
        model = lib.zoo.lenet5(num_particles=n)
    else:
        model = lib.zoo.mlp(x.shape[1], 10, num_particles=n, likelihood="categorical")
    model.compile(optimizer=OPTIMIZERS[optimizer](lib), dataset_size=1000)
    model.fit(x, y, epochs=1, batch_size=len(x), verbose=0)  # builds and traces
    return model, st.make_stepper(model, x, y, "fit", iterator)


def skipped(model):
    """Steps that did no update (non-finite loss, refused update, skipped curvature): they cost far less than a
    real step, so a row with any is not a timing of the method."""
    optimizer = model.optimizer
    counts = [model.skipped_steps] + [
        int(getattr(optimizer, name).numpy())
        for name in ("skipped_updates", "skipped_curvature_steps")
        if hasattr(optimizer, name)
    ]
    return int(sum(counts))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="HEAD~1", help="git ref of the earlier version")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--particles", type=int, default=10)
    parser.add_argument("--models", nargs="+", choices=st.ARCHS, default=list(st.ARCHS))
    parser.add_argument(
        "--optimizers", nargs="+", choices=sorted(OPTIMIZERS), default=list(OPTIMIZERS)
    )
    parser.add_argument("--out", default=harness.RESULTS_DIR)
    args = parser.parse_args()
    random.seed(0)
    commit = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    before_commit = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", args.before], capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as directory:
        before = import_before(args.before, directory)
        groups = {}
        for arch in args.models:
            (xtr, ytr), _ = bk.datasets.load_digits(image=(arch == "lenet5"))
            x, y = xtr[:64], ytr[:64]
            iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
            for name in args.optimizers:
                groups[(arch, name)] = {
                    "before": build(before, arch, name, args.particles, x, y, iterator),
                    "after": build(bk, arch, name, args.particles, x, y, iterator),
                }
        times = {key: {"before": [], "after": []} for key in groups}
        for _ in range(args.rounds):
            keys = list(groups)
            random.shuffle(keys)
            for key in keys:
                order = ["before", "after"]
                random.shuffle(order)
                for version in order:
                    step = groups[key][version][1]
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        logs = step()
                    harness.sync(logs)
                    times[key][version].append((time.perf_counter() - start) / args.steps)
    rows = []
    for (arch, name), t in times.items():
        ratios = np.array(t["after"]) / np.array(t["before"])
        rows.append(
            {
                "model": arch,
                "optimizer": name,
                "before_ms": 1e3 * float(np.median(t["before"])),
                "after_ms": 1e3 * float(np.median(t["after"])),
                "after_over_before": float(np.median(ratios)),
                "skipped_before": skipped(groups[(arch, name)]["before"][0]),
                "skipped_after": skipped(groups[(arch, name)]["after"][0]),
            }
        )
    result = {
        "before": before_commit,
        "after": commit,
        "particles": args.particles,
        "rounds": args.rounds,
        "steps": args.steps,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
        "rows": rows,
    }
    lines = [
        f"Step time, bayes_keras {commit} vs {before_commit} (N = {args.particles}, batch 64 digits; median of "
        f"{args.rounds} paired rounds of {args.steps} steps; TF_ENABLE_ONEDNN_OPTS={result['onednn']})",
        "",
        "| model | optimizer | before ms | after ms | after / before | skipped steps (before / after) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['optimizer']} | {r['before_ms']:.2f} | {r['after_ms']:.2f} | "
            f"{r['after_over_before']:.3f} | {r['skipped_before']} / {r['skipped_after']} |"
        )
    text = "\n".join(lines)
    print(text)
    harness.save_results("compare_versions", result, text, args.out)


if __name__ == "__main__":
    main()
