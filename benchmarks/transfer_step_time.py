"""Fit step time of a Bayesian head on a frozen backbone against the Keras fine-tune of the same head.

The backbone is examples/transfer_digits.py's MobileNetV2 at 32x32x1 (alpha 0.35 by default, weights=None:
the step's arithmetic does not depend on the weights' values), frozen, with a 5-class softmax head. Variants,
each driven by its own compiled train function on a persistent tf.data iterator that repeats one fixed batch
of 64 (what fit does per step), timed interleaved and paired (benchmarks/harness.py):

  keras_head       the Keras model, Adam(1e-3): the Keras fine-tune of the head
  gpf_head         bayesianize(bayesian=["head"]), N particles, GaussianParticleFlow()
  mgvbp_head       the same with MGVBP()
  gpf_last_block   bayesianize(bayesian=the last inverted-residual block + Conv_1 + head), GaussianParticleFlow()
  keras_finetune   the Keras model with the backbone trainable (the whole network fine-tuned), Adam(1e-3)
  gpf_full         bayesianize of the trainable model: every layer Bayesian, GaussianParticleFlow()

Reported: the median per-step time of each variant and each one's paired ratio to keras_head (and gpf_full's
to keras_finetune).

    python benchmarks/transfer_step_time.py [--particles 10] [--rounds 7] [--steps 10]
Writes benchmarks/results/transfer_step_time.{json,md}.
"""

import argparse
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import harness  # noqa: E402

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402
import transfer_digits  # noqa: E402


def stepper(model, iterator):
    model.make_train_function()
    train_function = model.train_function
    return lambda: [train_function(iterator)["loss"]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--particles", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=0.35)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--variants", nargs="+", default=None)
    parser.add_argument("--out", default=harness.RESULTS_DIR)
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    backbone = keras.applications.MobileNetV2(
        input_shape=(32, 32, 1), alpha=args.alpha, include_top=False, weights=None, pooling="avg"
    )
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(args.batch, 32, 32, 1)).astype("float32")
    y = rng.integers(0, 5, args.batch)
    iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    n, size = args.particles, 1000

    def keras_model(regime):
        model = transfer_digits.transfer_model(backbone, regime)
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        return model

    def bayesian(regime, bayesian_layers, optimizer):
        model = bk.bayesianize(
            transfer_digits.transfer_model(backbone, regime),
            num_particles=n,
            bayesian=bayesian_layers,
            seed=0,
        )
        model.compile(optimizer=optimizer, dataset_size=size)
        return model

    builders = {
        "keras_head": lambda: keras_model("frozen"),
        "gpf_head": lambda: bayesian("frozen", ["head"], bk.optimizers.GaussianParticleFlow()),
        "mgvbp_head": lambda: bayesian("frozen", ["head"], bk.optimizers.MGVBP()),
        "gpf_last_block": lambda: bayesian(
            "frozen", list(transfer_digits.LAST_BLOCK), bk.optimizers.GaussianParticleFlow()
        ),
        "keras_finetune": lambda: keras_model("finetuned"),
        "gpf_full": lambda: bayesian("finetuned", None, bk.optimizers.GaussianParticleFlow()),
    }
    names = args.variants or list(builders)
    fns, fractions = {}, {}
    for name in names:
        model = builders[name]()
        fns[name] = stepper(model, iterator)
        if isinstance(model, bk.BayesianModel):
            fractions[name] = bk.conversion_report(model).bayesian_fraction
    times = harness.interleaved_microseconds(fns, args.rounds, args.steps, np.random.default_rng(0))
    rows = []
    for name in names:
        base = (
            "keras_finetune"
            if name in ("gpf_full",) and "keras_finetune" in times
            else "keras_head"
        )
        ratio = harness.paired_ratio(times, name, base) if base in times else None
        rows.append(
            {
                "variant": name,
                "ms_per_step": float(np.median(times[name])) / 1e3,
                "ratio_to": base,
                "ratio": ratio,
                "bayesian_fraction": fractions.get(name),
            }
        )
    result = {
        "command": " ".join(sys.argv),
        "args": vars(args),
        "machine": harness.machine_info(),
        "rows": rows,
        "microseconds": times,
    }
    lines = [
        f"# Fit step time: Bayesian part on a frozen MobileNetV2 (alpha {args.alpha}, 32x32x1), N = {n}, "
        f"batch {args.batch}",
        "",
        f"`{result['command']}`; median of {args.rounds} interleaved rounds of {args.steps} steps; ratios "
        "paired within rounds. Machine: "
        + f"{result['machine']['processor']}, {result['machine']['cpu_count']} "
        f"CPUs, oneDNN {result['machine']['onednn']}, load {result['machine']['load_average_1_5_15min']}.",
        "",
        "| variant | ms / step | ratio | to | weights with particles |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        fraction = "" if r["bayesian_fraction"] is None else f"{r['bayesian_fraction']:.1%}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(
            f"| {r['variant']} | {r['ms_per_step']:.1f} | {ratio} | {r['ratio_to']} | {fraction} |"
        )
    stem = "transfer_step_time" + {"off": "_onednn_off", "on": "_onednn_on"}.get(
        harness.onednn_setting(), ""
    )
    for path in harness.save_results(stem, result, lines, out=args.out):
        print("wrote", path)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
