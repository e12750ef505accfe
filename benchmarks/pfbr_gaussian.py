"""PFBR on the conjugate multivariate Gaussian (Chen, Dai & Song 2019, Section 5, first experiment):
trained on 10-observation sequences, tested on 100-observation sequences, against one-pass SMC with
the same particle count, for d = 2, 5, 10.

Protocol per d: meta-train a ParticleFlowBayesRule on GaussianMeanProblem(d) (prior N(0, I),
o | x ~ N(x, 3^2 I); training priors are exact posteriors after 0..100 earlier observations); test on
`--sequences` unseen sequences of `--length` observations from the N(0, I) prior. At every step, the
posterior's moments (the mean error in posterior sds and the sd ratio, averaged over coordinates) and the
KDE cross-entropy -E_p[log KDE(particles)] to the exact posterior p (`--mc-samples` draws of p) for PFBR
and one-pass SMC, both with `--particles` particles, and for the same number of exact draws of p (the
floor under this metric at this N). SMC is scored on its weighted cloud (each stage's particles and
importance weights before resampling: weighted moments, a weighted KDE with Silverman's bandwidth at the
effective sample size); "SMC, moved" scores the equally weighted cloud it carries to the next stage
(resampled, then moved by the Liu-West kernel), as earlier versions of this table did. Table: moments and
cross-entropy averaged over steps, and the cross-entropy at steps 1, 10, 25, 50, 100, by d.

Usage:
    python benchmarks/pfbr_gaussian.py                    # ~30 min on 2 cores
    python benchmarks/pfbr_gaussian.py --dims 2 --iterations 50 --sequences 3   # smoke run
Writes benchmarks/results/pfbr_gaussian.{json,md}.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

from bayes_keras import pfbr  # noqa: E402

REPORT_STEPS = (1, 10, 25, 50, 100)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 5, 10])
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--train-particles", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--sequences", type=int, default=25)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--particles", type=int, default=256)
    parser.add_argument("--mc-samples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rows = []
    for d in args.dims:
        problem = pfbr.GaussianMeanProblem(dim=d)
        operator = pfbr.ParticleFlowBayesRule(latent_dim=d)
        start = time.time()
        history = operator.meta_fit(
            problem,
            iterations=args.iterations,
            tasks_per_iteration=args.tasks,
            num_particles=args.train_particles,
            sequence_length=10,
            learning_rate=args.learning_rate,
            seed=args.seed,
        )["loss"]
        train_seconds = time.time() - start
        rng = np.random.default_rng(10_000 + args.seed)
        task, observations = problem.sample_tasks(args.sequences, args.length, rng, prefix=0)
        mean, precision = problem.exact_posterior(task, observations)
        moved, cloud, weights = pfbr.SequentialMonteCarlo().filter(
            problem,
            task,
            observations,
            num_particles=args.particles,
            seed=args.seed + 1,
            weighted=True,
        )
        runs = {
            "PFBR": (
                operator.filter(
                    problem, task, observations, num_particles=args.particles, seed=args.seed + 1
                ),
                None,
            ),
            "SMC": (cloud, weights),
            "SMC, moved": (moved, None),
        }
        names = list(runs) + ["exact draws"]
        cross_entropy = {name: np.zeros((args.sequences, args.length)) for name in names}
        mean_error = {name: np.zeros((args.sequences, args.length)) for name in names}
        sd_ratio = {name: np.zeros((args.sequences, args.length)) for name in names}
        ess = np.zeros((args.sequences, args.length))
        for k in range(args.sequences):
            for n in range(args.length):
                std = 1 / np.sqrt(precision[k, n])
                target = mean[k, n] + std * rng.normal(size=(args.mc_samples, d))
                exact = mean[k, n] + std * rng.normal(size=(args.particles, d))
                for name in names:
                    if name == "exact draws":
                        particles, w = exact, None
                    else:
                        particles, w = (
                            runs[name][0][n, k],
                            None if runs[name][1] is None else runs[name][1][n, k],
                        )
                    cross_entropy[name][k, n] = pfbr.kde_cross_entropy(particles, target, weights=w)
                    m, sd = pfbr.weighted_moments(particles, w)
                    mean_error[name][k, n] = np.mean(np.abs(m - mean[k, n]) / std)
                    sd_ratio[name][k, n] = np.mean(sd / std)
                ess[k, n] = pfbr.effective_sample_size(weights[n, k])
        for name, values in cross_entropy.items():
            by_step = values.mean(0)
            rows.append(
                {
                    "dim": d,
                    "method": name,
                    "train_seconds": train_seconds if name == "PFBR" else None,
                    "mean_error_in_sds": float(mean_error[name].mean()),
                    "sd_ratio": float(sd_ratio[name].mean()),
                    "mean": float(by_step.mean()),
                    "at": {n: float(by_step[n - 1]) for n in REPORT_STEPS if n <= args.length},
                    "by_step": by_step.round(4).tolist(),
                    "effective_sample_size_median": float(np.median(ess))
                    if name == "SMC"
                    else None,
                    "effective_sample_size_min": float(ess.min()) if name == "SMC" else None,
                }
            )
        rows[-len(names)]["meta_training_loss"] = history
        print(d, [(r["method"], round(r["mean"], 3)) for r in rows[-len(names) :]], flush=True)

    steps = [n for n in REPORT_STEPS if n <= args.length]
    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": harness.machine_info(),
        "args": vars(args),
        "rows": rows,
    }
    lines = [
        "# PFBR vs one-pass SMC on the conjugate Gaussian, trained on 10 observations, tested on "
        f"{args.length}",
        "",
        f"{args.sequences} unseen sequences from the N(0, I) prior, {args.particles} particles for every method; "
        "mean error (in exact posterior sds) and sd ratio to the exact posterior, averaged over coordinates, "
        "steps and sequences; KDE cross-entropy to the exact posterior (lower is better), mean over sequences. "
        f"'exact draws' = {args.particles} draws of the exact posterior (the metric's floor at this N). SMC: "
        "its weighted cloud before resampling (weighted moments; weighted KDE, Silverman's bandwidth at the "
        "effective sample size, whose median (min) is given); 'SMC, moved': the equally weighted cloud it "
        "carries on (resampled, then Liu-West moved), as earlier versions of this table scored SMC. "
        f"Meta-training: {args.iterations} iterations x {args.tasks} tasks x {args.train_particles} particles, "
        "10-observation sequences.",
        "",
        "| d | method | mean error (sds) | sd ratio | cross-entropy, mean over steps | "
        + " | ".join(f"step {n}" for n in steps)
        + " | ESS |",
        "|---|---|---|---|---|" + "---|" * (len(steps) + 1),
    ]
    for row in rows:
        ess = (
            "-"
            if row["effective_sample_size_median"] is None
            else f"{row['effective_sample_size_median']:.0f} ({row['effective_sample_size_min']:.0f})"
        )
        lines.append(
            f"| {row['dim']} | {row['method']} | {row['mean_error_in_sds']:.3f} | {row['sd_ratio']:.3f} | "
            f"{row['mean']:.3f} | "
            + " | ".join(f"{row['at'][n]:.3f}" for n in steps)
            + f" | {ess} |"
        )
    lines += ["", f"Command: `{result['command']}`"]
    print("\n".join(lines))
    harness.save_results("pfbr_gaussian", result, lines)


if __name__ == "__main__":
    main()
