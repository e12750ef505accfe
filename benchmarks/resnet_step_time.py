"""Seconds per training step of ResNet-20 with N particles against N separate Keras ResNet-20s.

CIFAR-shaped inputs (32 x 32 x 3, random pixels and labels: the arithmetic does not depend on the
values), batch `--batch` (default 32). Variants, each one compiled training step as fit runs it:
  (a) bayes_keras `zoo.resnet20`, N particles, IndependentParticles (Adam), every part Bayesian
  (h) the hybrid: stem, stage 1 and stage 2 shared (`deterministic_parts`), stage 3 and head Bayesian
  (b) N separate Keras ResNet-20s (Adam), stepped one after another
  (f) one Keras ResNet-20 on N copies of the batch (the arithmetic of N networks, perfectly batched)
Timing as benchmarks/step_time.py: rounds visit every variant in shuffled order, a block of `--steps`
steps each; ratios are medians of within-visit ratios. Target (issue 13): a/b <= 0.5.

Usage:
    python benchmarks/resnet_step_time.py [--particles 4 8] [--rounds 6] [--steps 2]
Writes benchmarks/results/resnet_step_time.{json,md}.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_time as st  # noqa: E402  (sets TF env / logging, puts the repo on sys.path)
import harness  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402

SHAPE, CLASSES, HYBRID = (32, 32, 3), 10, ("stem", "stage1", "stage2")
VARIANTS = {"bk_full": "a", "bk_hybrid": "h", "keras_loop": "b", "keras_batched": "f"}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--particles", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default="resnet_step_time")
    args = parser.parse_args()
    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(size=(args.batch,) + SHAPE).astype(np.float32))
    y = tf.constant(rng.integers(0, CLASSES, args.batch).astype(np.int32))
    iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())

    def keras_resnet():
        model = bk.zoo.keras_resnet20(SHAPE, CLASSES)
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    def bayesian(n, parts):
        model = bk.zoo.resnet20(
            SHAPE, CLASSES, num_particles=n, deterministic_parts=parts, dataset_size=50_000
        )
        model.compile(optimizer=bk.optimizers.IndependentParticles(1e-3))
        return model

    def make(key, n, models, data=None):
        xd, yd, it = (x, y, iterator) if data is None else data
        variant = st.Variant(
            "resnet20", key, n, models, [st.make_stepper(m, xd, yd, "fit", it) for m in models]
        )
        for _ in range(2):
            harness.sync(variant.step())
        print(f"  built {variant.name} ({time.perf_counter() - t_start:.0f} s)", flush=True)
        return variant

    loop_models = [keras_resnet() for _ in range(max(args.particles))]
    groups = []
    for n in args.particles:
        members = {
            "bk_full": make("bk_full", n, [bayesian(n, ())]),
            "bk_hybrid": make("bk_hybrid", n, [bayesian(n, HYBRID)]),
            "keras_loop": make("keras_loop", n, loop_models[:n]),
            "keras_batched": make(
                "keras_batched", n, [keras_resnet()], data=st.tiled_batch(x, y, n)
            ),
        }
        groups.append(st.Group("resnet20", n, members))
    st.run_rounds(groups, args.rounds, args.steps, 0, t_start)
    rows = []
    for g in groups:
        ms = {k: 1e3 * statistics.median(v[k] for v in g.visits) for k in VARIANTS}
        ratio = {
            f"{VARIANTS[a]}/{VARIANTS[b]}": statistics.median(v[a] / v[b] for v in g.visits)
            for a, b in (
                ("bk_full", "keras_loop"),
                ("bk_hybrid", "keras_loop"),
                ("bk_full", "keras_batched"),
            )
        }
        rows.append({"N": g.n, "ms": ms, "ratios": ratio})
    lines = [
        f"ResNet-20 (CIFAR variant), 32 x 32 x 3 inputs, batch {args.batch}, one compiled training step; "
        f"median of {args.rounds} paired rounds of {args.steps} steps; {harness.onednn_setting()}. Command: "
        "`python benchmarks/resnet_step_time.py`.",
        "",
        "(a) particles, all Bayesian; (h) hybrid (stem, stages 1-2 shared); (b) N separate Keras ResNet-20s; "
        "(f) one Keras ResNet-20 on N x the batch.",
        "",
        "| N | (a) ms | (h) ms | (b) ms | (f) ms | a/b | h/b | a/f |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['N']} | {r['ms']['bk_full']:.0f} | {r['ms']['bk_hybrid']:.0f} | {r['ms']['keras_loop']:.0f} "
            f"| {r['ms']['keras_batched']:.0f} | {r['ratios']['a/b']:.2f} | {r['ratios']['h/b']:.2f} | "
            f"{r['ratios']['a/f']:.2f} |"
        )
    harness.save_results(
        args.out, {"args": vars(args), "rows": rows, "machine": harness.machine_info()}, lines
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
