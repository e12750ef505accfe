"""Out-of-distribution detection on digits: train on 0-4, tell held-out 5-9 from held-out 0-4.

LeNet-5 on scikit-learn's 8x8 digits (the main job's 75/25 split, seed 0), trained only on the classes
0-4 (30 epochs, batch 64, 10 particles); scored on the held-out images of 0-4 (in distribution) and of
5-9 (never seen). Reported per method, mean ± sd over seeds: held-out accuracy on 0-4 and the AUROC of
telling 5-9 from 0-4 by the predictive entropy and by the mutual information (epistemic part; zero for a
single deterministic network). GPF and the deep ensemble use the main job's settings; the other
optimizers their constructor defaults (MGVBP: its defaults, T = 1).

Usage:
    python benchmarks/ood_digits.py [--seeds 0 1 2]
Writes benchmarks/results/ood_digits.{json,md}.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402

EPOCHS, BATCH, PARTICLES = 30, 64, 10
OPTIMIZERS = {
    "deep ensemble (IndependentParticles(3e-3))": lambda: bk.optimizers.IndependentParticles(3e-3),
    "GPF (3e-3, per layer)": lambda: bk.optimizers.GaussianParticleFlow(
        3e-3, structure="layer", step_rule="rmsprop"
    ),
    "SVGD()": lambda: bk.optimizers.SVGD(),
    "MatrixSVGD()": lambda: bk.optimizers.MatrixSVGD(),
    "PreconditionedParticles()": lambda: bk.optimizers.PreconditionedParticles(),
    "MeanFieldVI()": lambda: bk.optimizers.MeanFieldVI(),
    "MGVBP()": lambda: bk.optimizers.MGVBP(),
}
DETERMINISTIC = "deterministic LeNet (Keras, Adam)"


def split():
    (xtr, ytr), (xte, yte) = bk.datasets.load_digits(test_fraction=0.25, seed=0)
    known_tr, known_te = ytr < 5, yte < 5
    return (xtr[known_tr], ytr[known_tr]), (xte[known_te], yte[known_te]), xte[~known_te]


def scores_deterministic(data, seed):
    (xtr, ytr), (x_in, y_in), x_out = data
    keras.utils.set_random_seed(seed)
    model = bk.zoo.keras_lenet5(xtr.shape[1:], 5)
    model.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(xtr, ytr, batch_size=BATCH, epochs=EPOCHS, verbose=0)

    def entropy(x):
        p = tf.nn.softmax(model.predict(x, verbose=0)).numpy()
        return -np.sum(p * np.log(np.maximum(p, 1e-30)), 1), p

    h_in, p_in = entropy(x_in)
    h_out, _ = entropy(x_out)
    return {
        "accuracy": bk.metrics.accuracy(p_in, y_in),
        "auroc_entropy": bk.metrics.auroc(h_in, h_out),
        "auroc_mutual_information": float("nan"),
    }


def scores_bayesian(data, seed, name):
    (xtr, ytr), (x_in, y_in), x_out = data
    keras.utils.set_random_seed(seed)
    model = bk.zoo.lenet5(xtr.shape[1:], 5, num_particles=PARTICLES)
    model.compile(optimizer=OPTIMIZERS[name]())
    model.fit(xtr, ytr, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    auroc = bk.metrics.ood_auroc(model, x_in, x_out)
    return {
        "accuracy": bk.metrics.accuracy(model.predict(x_in, verbose=0), y_in),
        "auroc_entropy": auroc["total_entropy"],
        "auroc_mutual_information": auroc["mutual_information"],
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="*", default=[DETERMINISTIC] + list(OPTIMIZERS))
    parser.add_argument("--out", default="ood_digits")
    args = parser.parse_args()
    data = split()
    results = {}
    for name in args.methods:
        runs = []
        for seed in args.seeds:
            start = time.perf_counter()
            run = (
                scores_deterministic(data, seed)
                if name == DETERMINISTIC
                else scores_bayesian(data, seed, name)
            )
            run["seconds"] = time.perf_counter() - start
            runs.append(run)
            print(name, seed, {k: round(v, 4) for k, v in run.items()}, flush=True)
        results[name] = runs
    cols = ("accuracy", "auroc_entropy", "auroc_mutual_information")
    lines = [
        f"LeNet-5, digits 0-4 for training ({len(data[0][1])} images), held out: {len(data[1][1])} of 0-4 vs "
        f"{len(data[2])} of 5-9; {EPOCHS} epochs, {PARTICLES} particles; mean ± sd over seeds {args.seeds}",
        "",
        "| method | accuracy (0-4) | AUROC, predictive entropy | AUROC, mutual information |",
        "|---|---|---|---|",
    ]
    for name, runs in results.items():
        cells = []
        for k in cols:
            v = np.array([r[k] for r in runs])
            cells.append("n/a" if np.all(np.isnan(v)) else f"{v.mean():.4f} ± {v.std():.4f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    harness.save_results(
        args.out, {"args": vars(args), "results": results, "machine": harness.machine_info()}, lines
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
