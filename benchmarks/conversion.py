"""The README's conversion example, measured: a trained Keras CNN on the 8x8 digits, `bayesianize` with its
defaults, held-out accuracy / NLL / ECE and mutual information at step 0, and after a few epochs of each
optimizer with its defaults (each from the same conversion). Also the step-0 figures over a grid of
noise_std, the relative jitter the particles start with.

    python benchmarks/conversion.py [--epochs 3] [--seeds 3]

Writes results/conversion.json and results/conversion.md.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import bayes_keras as bk  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)
from convert_keras_model import keras_cnn  # noqa: E402  (the README example's CNN)
from harness import onednn_setting, save_results  # noqa: E402

OPTIMIZERS = {
    "GaussianParticleFlow(step_rule='rmsprop')": lambda: bk.optimizers.GaussianParticleFlow(
        step_rule="rmsprop"
    ),
    "SVGD()": lambda: bk.optimizers.SVGD(),
    "MatrixSVGD()": lambda: bk.optimizers.MatrixSVGD(),
    "IndependentParticles()": lambda: bk.optimizers.IndependentParticles(),
    "PreconditionedParticles()": lambda: bk.optimizers.PreconditionedParticles(),
    "MGVBP()": lambda: bk.optimizers.MGVBP(),
    "MeanFieldVI()": lambda: bk.optimizers.MeanFieldVI(),
}


def scores(model, x, y):
    probs = model.predict(x, verbose=0)
    s = bk.metrics.evaluate_probs(probs, y)
    out = {k: float(s[k]) for k in ("accuracy", "nll", "ece")}
    if isinstance(model, bk.BayesianModel):
        out["mutual_information"] = float(np.mean(model.uncertainty(x)["mutual_information"]))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--epochs", type=int, default=3, help="epochs of each optimizer after the conversion"
    )
    parser.add_argument("--keras-epochs", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    (x, y), (xt, yt) = bk.datasets.load_digits()
    rows, grid = [], []
    for seed in range(args.seeds):
        keras.utils.set_random_seed(seed)
        cnn = keras_cnn()
        cnn.compile("adam", "sparse_categorical_crossentropy")
        cnn.fit(x, y, epochs=args.keras_epochs, batch_size=64, verbose=0)
        rows.append({"seed": seed, "model": "Keras CNN", **scores(cnn, xt, yt)})
        for noise in (0.0, 0.05, 0.1, 0.2, 0.5):
            model = bk.bayesianize(cnn, num_particles=10, noise_std=noise, seed=seed)
            grid.append({"seed": seed, "noise_std": noise, **scores(model, xt, yt)})
        rows.append(
            {
                "seed": seed,
                "model": "bayesianize(cnn), step 0",
                **scores(bk.bayesianize(cnn, num_particles=10, seed=seed), xt, yt),
            }
        )
        for name, make in OPTIMIZERS.items():
            keras.utils.set_random_seed(seed)
            model = bk.bayesianize(cnn, num_particles=10, seed=seed)
            model.compile(optimizer=make())
            start = time.perf_counter()
            model.fit(x, y, epochs=args.epochs, batch_size=64, verbose=0)
            rows.append(
                {
                    "seed": seed,
                    "model": f"{name}, {args.epochs} epochs",
                    "seconds": time.perf_counter() - start,
                    **scores(model, xt, yt),
                }
            )
            print(rows[-1], flush=True)

    def summary(entries, key):
        values = np.array([e[key] for e in entries if key in e], dtype=np.float64)
        return f"{values.mean():.4f} ± {values.std():.4f}" if len(values) else "-"

    names = list(dict.fromkeys(r["model"] for r in rows))
    lines = [
        f"# Converting a trained Keras CNN (8x8 digits, 10 particles, {args.seeds} seeds, mean ± sd)",
        "",
        "`bk.bayesianize(cnn, num_particles=10)` with its defaults (noise_std=0.1 relative to each weight "
        "tensor's rms), then each optimizer with its defaults from that conversion, batch 64. Held-out "
        "scores of the posterior predictive; mutual information = mean epistemic part of the predictive "
        "entropy (nats).",
        "",
        "| model | accuracy | NLL | ECE | mutual information |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        entries = [r for r in rows if r["model"] == name]
        lines.append(
            f"| {name} | "
            + " | ".join(
                summary(entries, k) for k in ("accuracy", "nll", "ece", "mutual_information")
            )
            + " |"
        )
    lines += [
        "",
        "Step 0 over the relative jitter noise_std (same trained CNNs):",
        "",
        "| noise_std | accuracy | NLL | mutual information |",
        "|---|---|---|---|",
    ]
    for noise in sorted({g["noise_std"] for g in grid}):
        entries = [g for g in grid if g["noise_std"] == noise]
        lines.append(
            f"| {noise} | "
            + " | ".join(summary(entries, k) for k in ("accuracy", "nll", "mutual_information"))
            + " |"
        )
    lines += [
        "",
        f"oneDNN: {onednn_setting()}. Command: python benchmarks/conversion.py --epochs {args.epochs} "
        f"--seeds {args.seeds}",
    ]
    result = {"rows": rows, "noise_grid": grid, "epochs": args.epochs, "onednn": onednn_setting()}
    save_results("conversion", result, lines, **({"out": args.out} if args.out else {}))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
