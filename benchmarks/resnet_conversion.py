"""A trained Keras ResNet-20, converted with `bayesianize`'s defaults, then trained by each optimizer with its
defaults: does inference-mode accuracy stay at the trained network's?

`bayes_keras.zoo.keras_resnet20` (plain Keras layers, BatchNormalization after every convolution) is trained
on the 8x8 digits (1,347 train / 450 test) with Adam 1e-3 for `--keras-epochs` epochs, batch 64; then
`bk.bayesianize(net, num_particles=8, likelihood="categorical")` and `--epochs` epochs of
GaussianParticleFlow(step_rule="rmsprop") (the default rule when the published tables were measured), MGVBP()
and MatrixSVGD(), batch 64; "GaussianParticleFlow()" (dimension-wise Adam) on request. Inference-mode held-out accuracy (the
BatchNormalization moving statistics) after every epoch; `--batch-norm-momentum` sets bayesianize's argument
(default: bayesianize's own default; "keep" keeps the Keras layers' 0.99). fit recomputes the statistics for
the final weights when it ends (its default); `--running-averages` keeps the running averages instead.

Usage:
    python benchmarks/resnet_conversion.py [--seeds 0] [--epochs 10] [--batch-norm-momentum keep]
        [--optimizers "GaussianParticleFlow(1e-3)" ...] [--stem NAME] [--running-averages]
Writes benchmarks/results/resnet_conversion[_<momentum>].{json,md}.
"""

import argparse
import os
import shlex
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import keras  # noqa: E402

import bayes_keras as bk  # noqa: E402

OPTIMIZERS = {
    "GaussianParticleFlow(step_rule='rmsprop')": lambda: bk.optimizers.GaussianParticleFlow(
        step_rule="rmsprop"
    ),
    "MGVBP()": lambda: bk.optimizers.MGVBP(),
    "MatrixSVGD()": lambda: bk.optimizers.MatrixSVGD(),
    "GaussianParticleFlow()": lambda: bk.optimizers.GaussianParticleFlow(),
    "GaussianParticleFlow(1e-3)": lambda: bk.optimizers.GaussianParticleFlow(
        1e-3, step_rule="rmsprop"
    ),
    "GaussianParticleFlow(step_rule='signal_rmsprop')": lambda: bk.optimizers.GaussianParticleFlow(
        step_rule="signal_rmsprop"
    ),
}
DEFAULTS = ["GaussianParticleFlow(step_rule='rmsprop')", "MGVBP()", "MatrixSVGD()"]


def accuracy(model, x, y):
    return float(np.mean(np.argmax(model.predict(x, verbose=0, batch_size=256), axis=-1) == y))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--keras-epochs", type=int, default=30)
    parser.add_argument("--optimizers", nargs="+", choices=list(OPTIMIZERS), default=DEFAULTS)
    parser.add_argument(
        "--stem", default=None, help="results file name (default from the momentum setting)"
    )
    parser.add_argument(
        "--batch-norm-momentum", default=None, help="a number, 'keep', or omitted (the default)"
    )
    parser.add_argument(
        "--running-averages",
        action="store_true",
        help="fit(refresh_batch_norm=False): score with the running averages, as Keras keeps them",
    )
    args = parser.parse_args()
    momentum = (
        {}
        if args.batch_norm_momentum is None
        else {
            "batch_norm_momentum": None
            if args.batch_norm_momentum == "keep"
            else float(args.batch_norm_momentum)
        }
    )
    (x, y), (xt, yt) = bk.datasets.load_digits(image=True, seed=0)
    rows = []
    for seed in args.seeds:
        keras.utils.set_random_seed(seed)
        net = bk.zoo.keras_resnet20(input_shape=x.shape[1:], num_classes=10)
        net.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        net.fit(x, y, epochs=args.keras_epochs, batch_size=64, verbose=0)
        start = accuracy(net, xt, yt)
        for name in args.optimizers:
            keras.utils.set_random_seed(seed)
            model = bk.bayesianize(
                net, num_particles=8, likelihood="categorical", seed=seed, **momentum
            )
            model.compile(optimizer=OPTIMIZERS[name]())
            curve, began = [accuracy(model, xt, yt)], time.perf_counter()
            for _ in range(args.epochs):
                model.fit(
                    x,
                    y,
                    epochs=1,
                    batch_size=64,
                    verbose=0,
                    refresh_batch_norm=not args.running_averages,
                )
                curve.append(accuracy(model, xt, yt))
            rows.append(
                {
                    "seed": seed,
                    "optimizer": name,
                    "keras_accuracy": start,
                    "accuracy_by_epoch": curve,
                    "seconds": time.perf_counter() - began,
                }
            )
            print(rows[-1], flush=True)
    setting = "default" if args.batch_norm_momentum is None else args.batch_norm_momentum
    lines = [
        f"# A trained Keras ResNet-20, bayesianize (batch_norm_momentum: {setting}), {args.epochs} epochs of "
        "each optimizer's defaults",
        "",
        f"8x8 digits, 8 particles, batch 64; Keras ResNet-20 trained {args.keras_epochs} epochs (Adam 1e-3). "
        "Inference-mode held-out accuracy (moving statistics: "
        + (
            "running averages"
            if args.running_averages
            else "recomputed for the final weights when fit ends"
        )
        + ") at the start, after 1 epoch, the lowest over "
        f"the run and after {args.epochs} epochs; seeds {args.seeds}.",
        "",
        "| seed | optimizer | Keras | after 1 epoch | lowest | final | final - Keras |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["accuracy_by_epoch"]
        lines.append(
            f"| {r['seed']} | {r['optimizer']} | {r['keras_accuracy']:.4f} | {c[1]:.4f} | {min(c):.4f} | "
            f"{c[-1]:.4f} | {c[-1] - r['keras_accuracy']:+.4f} |"
        )
    lines += ["", "Command: python benchmarks/resnet_conversion.py " + shlex.join(sys.argv[1:])]
    stem = args.stem or "resnet_conversion" + (
        "" if args.batch_norm_momentum is None else f"_momentum_{setting}"
    )
    harness.save_results(
        stem, {"args": vars(args), "rows": rows, "machine": harness.machine_info()}, lines
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
