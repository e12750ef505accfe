"""Proposition 1 of Havasi et al. (2021) per refined sample, on conjugate regression with known evidence.

Proposition 1: ELBO_aux >= ELBO of the base q, IF no stage ends below its warm-start value. The warm
start of every stage is the exact conditional of q (closed form), so a stage that optimised its
conditional ELBO exactly could not lose; stochastic Adam steps can, per sample. This script measures how
often: M = 400 samples of the optimal mean-field q of a 3-D correlated Bayesian linear regression (the
model of tests/refinement/test_refinement.py), K = 4 stages of 300 Adam steps. Reported: the fraction of samples whose
bound after each stage is at least the bound before it, and at the end at least the base ELBO; the mean
bounds against the exact log evidence. With `--steps 0` (warm starts only) every stage is exactly neutral.

Usage:
    python benchmarks/refinement_proposition1.py
Writes benchmarks/results/refinement_proposition1.{json,md}.
"""

import argparse
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import bayes_keras as bk  # noqa: E402


def correlated_regression(noise=0.5, n=30, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)) @ np.array([[1.0, 0.9, 0.6], [0.0, 0.4, 0.3], [0.0, 0.0, 0.4]])
    y = x @ np.array([1.0, -1.0, 0.5]) + noise * rng.standard_normal(n)
    precision = x.T @ x / noise**2 + np.eye(3)
    gram = x @ x.T + noise**2 * np.eye(n)
    log_evidence = -0.5 * (y @ np.linalg.solve(gram, y) + np.linalg.slogdet(2 * np.pi * gram)[1])
    xt, yt = tf.constant(x), tf.constant(y)

    def log_likelihood(w):
        r = yt[None] - tf.matmul(w, xt, transpose_b=True)
        return tf.reduce_sum(
            -0.5 * tf.square(r) / noise**2 - 0.5 * np.log(2 * np.pi * noise**2), axis=1
        )

    mean = np.linalg.solve(precision, x.T @ y / noise**2)
    return log_likelihood, mean, 1.0 / np.sqrt(np.diag(precision)), log_evidence


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="refinement_proposition1")
    args = parser.parse_args()
    log_likelihood, mean, sd, log_evidence = correlated_regression()
    rows = []
    for seed in args.seeds:
        _, history = bk.refinement.refine_log_prob(
            log_likelihood,
            mean,
            sd,
            num_samples=args.samples,
            num_stages=args.stages,
            steps_per_stage=args.steps,
            learning_rate=0.03,
            seed=seed,
            eval_samples=64,
        )
        bounds = np.asarray(history.elbo_aux)  # (K + 1, M): base ELBO, then after each stage
        rows.append(
            {
                "seed": seed,
                "mean_bounds": bounds.mean(1).tolist(),
                "stage_not_below_previous": (bounds[1:] >= bounds[:-1]).mean(1).tolist(),
                "final_not_below_base": float((bounds[-1] >= bounds[0]).mean()),
            }
        )
        print(rows[-1], flush=True)
    final = np.array([r["final_not_below_base"] for r in rows])
    stages = np.array([r["stage_not_below_previous"] for r in rows])
    means = np.array([r["mean_bounds"] for r in rows])
    lines = [
        f"Conjugate 3-D correlated regression, M = {args.samples} samples, K = {args.stages} stages x "
        f"{args.steps} Adam steps, seeds {args.seeds}; exact log evidence {log_evidence:.3f}.",
        "",
        "| | base | " + " | ".join(f"stage {k + 1}" for k in range(args.stages)) + " |",
        "|---" * (args.stages + 2) + "|",
        "| mean bound (nats) | " + " | ".join(f"{v:.3f}" for v in means.mean(0)) + " |",
        "| samples whose bound did not fall in this stage | | "
        + " | ".join(f"{v:.3f}" for v in stages.mean(0))
        + " |",
        "",
        f"Samples whose final ELBO_aux is at least their base ELBO: {final.mean():.3f} (per seed "
        f"{', '.join(f'{v:.3f}' for v in final)}).",
    ]
    harness.save_results(
        args.out, {"args": vars(args), "log_evidence": log_evidence, "runs": rows}, lines
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
