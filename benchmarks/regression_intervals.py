"""Calibrated regression on raw targets with default settings: diabetes, 5 random 80/20 splits.

Every optimizer runs with no constructor arguments on `bayes_keras.zoo.mlp(10, 1, (50,))` with
`likelihood="normal"` (learned noise, targets standardised and mapped back by the likelihood), 10
particles, batch 32. Reported on the held-out split, in the targets' units: RMSE of the predictive mean,
test log likelihood per example, and the coverage and mean width of the central 95% predictive interval
(exact quantiles of the particle mixture).

Usage:
    python benchmarks/regression_intervals.py [--epochs 200] [--splits 5]
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
    "GaussianParticleFlow()": lambda: bk.optimizers.GaussianParticleFlow(),
    "SVGD()": lambda: bk.optimizers.SVGD(),
    "MGVBP()": lambda: bk.optimizers.MGVBP(),
    "IndependentParticles() (deep ensemble)": lambda: bk.optimizers.IndependentParticles(),
}


def run(name, split, epochs):
    (x, y), (x_test, y_test) = bk.datasets.load_diabetes(seed=split)
    keras.utils.set_random_seed(split)
    model = bk.zoo.mlp(10, 1, (50,), num_particles=10, likelihood="normal")
    model.compile(optimizer=OPTIMIZERS[name](), metrics=[bk.metrics.IntervalCoverage(0.95),
                                                         bk.metrics.IntervalWidth(0.95)])
    start = time.perf_counter()
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    seconds = time.perf_counter() - start
    logs = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    dist = model.predictive(x_test)
    mean = model.predict(x_test, verbose=0)["mean"][:, 0]
    return {"rmse": bk.metrics.rmse(mean, y_test), "log_likelihood": bk.metrics.log_likelihood(dist, y_test),
            "coverage_95": logs["coverage_95"], "width_95": logs["width_95"],
            "noise_scale": float(model.likelihood.noise_scale().numpy()[0]), "seconds": seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS))
    parser.add_argument("--out", default="regression_intervals")
    args = parser.parse_args()
    results = {}
    for name in args.optimizers:
        rows = [run(name, split, args.epochs) for split in range(args.splits)]
        results[name] = {k: [r[k] for r in rows] for k in rows[0]}
        summary = {k: f"{np.mean(v):.3f} ± {np.std(v):.3f}" for k, v in results[name].items()}
        print(name, summary, flush=True)
    lines = [f"diabetes, 5 splits 80/20, zoo.mlp(10, 1, (50,)), likelihood='normal' (defaults), 10 particles, "
             f"{args.epochs} epochs, batch 32; mean ± sd over splits {list(range(args.splits))}", "",
             "| optimizer | RMSE | test log likelihood | 95% coverage | 95% width | learned noise sd |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        cells = [f"{np.mean(r[k]):.3f} ± {np.std(r[k]):.3f}" for k in
                 ("rmse", "log_likelihood", "coverage_95", "width_95", "noise_scale")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    harness.save_results(args.out, {"args": vars(args), "results": results, "machine": harness.machine_info()},
                         "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
