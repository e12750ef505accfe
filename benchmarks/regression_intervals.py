"""Calibrated regression on raw targets with default settings: diabetes, 5 random 80/20 splits.

Every optimizer runs with no constructor arguments on `bayes_keras.zoo.mlp(10, 1, (50,))` with
`likelihood="normal"` (learned noise, targets standardised and mapped back by the likelihood), 10
particles, batch 32. Training protocol (default): the Keras idiom, up to `--epochs` 300 epochs with
`EarlyStopping(monitor="val_nll", patience=20, restore_best_weights=True)` on `validation_split=0.2` of
the training rows; `--fixed-epochs` trains all training rows for exactly `--epochs` epochs instead.
Reported on the held-out split, in the targets' units: RMSE of the predictive mean, test log likelihood
per example, and the coverage and mean width of the central 95% predictive interval (exact quantiles of
the particle mixture).

Usage:
    python benchmarks/regression_intervals.py                          # early stopping
    python benchmarks/regression_intervals.py --fixed-epochs --epochs 40 --out regression_intervals_40_epochs
Writes benchmarks/results/regression_intervals.{json,md}.
"""

import argparse
import os
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
    "SVGD()": lambda: bk.optimizers.SVGD(),
    "MGVBP()": lambda: bk.optimizers.MGVBP(),
    "IndependentParticles() (deep ensemble)": lambda: bk.optimizers.IndependentParticles(),
}


def run(name, split, epochs, fixed_epochs):
    (x, y), (x_test, y_test) = bk.datasets.load_diabetes(seed=split)
    keras.utils.set_random_seed(split)
    model = bk.zoo.mlp(10, 1, (50,), num_particles=10, likelihood="normal")
    model.compile(
        optimizer=OPTIMIZERS[name](),
        metrics=[bk.metrics.IntervalCoverage(0.95), bk.metrics.IntervalWidth(0.95)],
    )
    start = time.perf_counter()
    if fixed_epochs:
        history = model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    else:
        stop = keras.callbacks.EarlyStopping(
            monitor="val_nll", patience=20, restore_best_weights=True
        )
        history = model.fit(
            x, y, epochs=epochs, batch_size=32, validation_split=0.2, callbacks=[stop], verbose=0
        )
    seconds = time.perf_counter() - start
    logs = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    dist = model.predictive(x_test)
    mean = model.predict(x_test, verbose=0)["mean"][:, 0]
    return {
        "rmse": bk.metrics.rmse(mean, y_test),
        "log_likelihood": bk.metrics.log_likelihood(dist, y_test),
        "coverage_95": logs["coverage_95"],
        "width_95": logs["width_95"],
        "noise_scale": float(model.likelihood.noise_scale().numpy()[0]),
        "epochs": len(history.history["loss"]),
        "seconds": seconds,
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--fixed-epochs", action="store_true")
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS))
    parser.add_argument("--out", default="regression_intervals")
    args = parser.parse_args()
    results = {}
    for name in args.optimizers:
        rows = [run(name, split, args.epochs, args.fixed_epochs) for split in range(args.splits)]
        results[name] = {k: [r[k] for r in rows] for k in rows[0]}
        summary = {k: f"{np.mean(v):.3f} ± {np.std(v):.3f}" for k, v in results[name].items()}
        print(name, summary, flush=True)
    protocol = (
        f"{args.epochs} epochs on all training rows"
        if args.fixed_epochs
        else f"EarlyStopping(monitor='val_nll', patience=20, restore_best_weights=True) on validation_split=0.2, "
        f"at most {args.epochs} epochs"
    )
    lines = [
        f"diabetes, {args.splits} splits 80/20, zoo.mlp(10, 1, (50,)), likelihood='normal' (defaults: raw "
        f"targets), every optimizer with no arguments, 10 particles, batch 32, {protocol}; mean ± sd over "
        f"splits {list(range(args.splits))}. Command: `python benchmarks/regression_intervals.py"
        f"{' --fixed-epochs --epochs %d' % args.epochs if args.fixed_epochs else ''}`",
        "",
        "| optimizer | RMSE | test log likelihood | 95% coverage | 95% width | learned noise sd | epochs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        cells = [
            f"{np.mean(r[k]):.3f} ± {np.std(r[k]):.3f}"
            for k in ("rmse", "log_likelihood", "coverage_95", "width_95", "noise_scale", "epochs")
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    harness.save_results(
        args.out,
        {"args": vars(args), "results": results, "machine": harness.machine_info()},
        "\n".join(lines) + "\n",
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
