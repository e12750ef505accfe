"""PFBR on the conjugate multivariate Gaussian (Chen, Dai & Song 2019, Section 5, first experiment):
trained on 10-observation sequences, tested on 100-observation sequences, against one-pass SMC with
the same particle count, for d = 2, 5, 10.

Protocol per d: meta-train a ParticleFlowBayesRule on GaussianMeanProblem(d) (prior N(0, I),
o | x ~ N(x, 3^2 I); training priors are exact posteriors after 0..100 earlier observations); test on
`--sequences` unseen sequences of `--length` observations from the N(0, I) prior. At every step, the
KDE cross-entropy -E_p[log KDE(particles)] to the exact posterior p (`--mc-samples` draws of p) for PFBR
and one-pass SMC (resample + Liu-West move), both with `--particles` particles, and for the same number
of exact draws of p (the floor under this metric). Table: cross-entropy at steps 1, 10, 25, 50, 100
and the mean over steps, by d.

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
        history = operator.meta_fit(problem, iterations=args.iterations, tasks_per_iteration=args.tasks,
                                    num_particles=args.train_particles, sequence_length=10,
                                    learning_rate=args.learning_rate, seed=args.seed)["loss"]
        train_seconds = time.time() - start
        rng = np.random.default_rng(10_000 + args.seed)
        task, observations = problem.sample_tasks(args.sequences, args.length, rng, prefix=0)
        mean, precision = problem.exact_posterior(task, observations)
        runs = {"PFBR": operator.filter(problem, task, observations, num_particles=args.particles, seed=args.seed + 1),
                "SMC": pfbr.SequentialMonteCarlo().filter(problem, task, observations, num_particles=args.particles,
                                                          seed=args.seed + 1)}
        cross_entropy = {name: np.zeros((args.sequences, args.length)) for name in list(runs) + ["exact draws"]}
        for k in range(args.sequences):
            for n in range(args.length):
                std = 1 / np.sqrt(precision[k, n])
                target = mean[k, n] + std * rng.normal(size=(args.mc_samples, d))
                for name, particles in runs.items():
                    cross_entropy[name][k, n] = pfbr.kde_cross_entropy(particles[n, k], target)
                exact = mean[k, n] + std * rng.normal(size=(args.particles, d))
                cross_entropy["exact draws"][k, n] = pfbr.kde_cross_entropy(exact, target)
        for name, values in cross_entropy.items():
            by_step = values.mean(0)
            rows.append({"dim": d, "method": name, "train_seconds": train_seconds if name == "PFBR" else None,
                         "mean": float(by_step.mean()), "at": {n: float(by_step[n - 1]) for n in REPORT_STEPS if n <= args.length},
                         "by_step": by_step.round(4).tolist()})
        rows[-3]["meta_training_loss"] = history
        print(d, [(r["method"], round(r["mean"], 3)) for r in rows[-3:]], flush=True)

    steps = [n for n in REPORT_STEPS if n <= args.length]
    result = {"command": "python " + " ".join(sys.argv), "machine": harness.machine_info(), "args": vars(args), "rows": rows}
    lines = ["# PFBR vs one-pass SMC on the conjugate Gaussian, trained on 10 observations, tested on "
             f"{args.length}", "",
             f"KDE cross-entropy to the exact posterior (lower is better), mean over {args.sequences} unseen sequences "
             f"from the N(0, I) prior; {args.particles} particles for every method; 'exact draws' = {args.particles} draws "
             f"of the exact posterior (the floor under this metric). Meta-training: {args.iterations} iterations x "
             f"{args.tasks} tasks x {args.train_particles} particles, 10-observation sequences.", "",
             "| d | method | " + " | ".join(f"step {n}" for n in steps) + " | mean over steps |",
             "|---|---|" + "---|" * (len(steps) + 1)]
    for row in rows:
        lines.append(f"| {row['dim']} | {row['method']} | " + " | ".join(f"{row['at'][n]:.3f}" for n in steps)
                     + f" | {row['mean']:.3f} |")
    lines += ["", f"Command: `{result['command']}`"]
    print("\n".join(lines))
    harness.save_results("pfbr_gaussian", result, lines)


if __name__ == "__main__":
    main()
