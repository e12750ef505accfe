"""Online Bayesian logistic regression with a meta-learned PFBR operator: scikit-learn digits 8 vs 6,
PCA features, tasks made by rotating the two leading components (the BLR-Meta experiment of Chen,
Dai & Song 2019, Section 5, on the offline digits instead of MNIST-8M).

Protocol: digits 8 (label 1) vs 6 (label 0), a stratified 70/30 split; PCA to `--components` on the
training split, each component scaled to unit variance. A task rotates components 0 and 1 by an angle
uniform in [-15, 15] degrees (the authors' setting) and streams the training examples in its own random
order, `--batch` at a time. Meta-train on `--iterations` such tasks; test on `--test-tasks` fresh angles
and orders: start from the prior N(0, I) particles; at every stage predict the incoming batch (online
accuracy, as in the paper's Fig. 5), then update on its labels; also the accuracy on the rotated held-out
split after each update. One-pass SMC with the same particle count is run on the same streams and scored
on its weighted cloud (each stage's particles and importance weights before resampling: a weighted
predictive) and, as "SMC, moved", on the equally weighted cloud it carries on (resampled, then moved by
the Liu-West kernel), as earlier versions of this table scored it.

Usage:
    python benchmarks/pfbr_logistic_digits.py             # ~10 min on 2 cores
    python benchmarks/pfbr_logistic_digits.py --smc-only  # the SMC rows only, no meta-training (seconds)
Writes benchmarks/results/pfbr_logistic_digits.{json,md,png} (pfbr_logistic_digits_smc.{json,md} with --smc-only).
"""

import argparse
import math
import os
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.decomposition import PCA
from sklearn.model_selection import train_test_split

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

from bayes_keras import pfbr  # noqa: E402


def digits_8_vs_6(components, seed=0):
    digits = load_digits()
    keep = np.isin(digits.target, (6, 8))
    x, y = digits.data[keep], (digits.target[keep] == 8).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.3, stratify=y, random_state=seed
    )
    pca = PCA(components, random_state=seed).fit(x_train)
    scale = np.sqrt(pca.explained_variance_)
    return (
        (pca.transform(x_train) / scale).astype(np.float32),
        y_train,
        (pca.transform(x_test) / scale).astype(np.float32),
        y_test,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--components", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--stages", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--train-particles", type=int, default=64)
    parser.add_argument("--particles", type=int, default=256)
    parser.add_argument("--test-tasks", type=int, default=20)
    parser.add_argument("--divergence", default="exact", choices=["exact", "hutchinson"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--smc-only", action="store_true", help="score SMC only (its rows do not depend on PFBR)"
    )
    args = parser.parse_args()

    x_train, y_train, x_test, y_test = digits_8_vs_6(args.components, args.seed)
    problem = pfbr.LogisticRegressionProblem(
        x_train, y_train, batch_size=args.batch, max_angle=math.radians(15)
    )
    operator = pfbr.ParticleFlowBayesRule(latent_dim=problem.latent_dim, divergence=args.divergence)
    start = time.time()
    history = (
        None
        if args.smc_only
        else operator.meta_fit(
            problem,
            iterations=args.iterations,
            tasks_per_iteration=args.tasks,
            num_particles=args.train_particles,
            sequence_length=args.stages,
            segment_length=10,
            learning_rate=1e-3,
            seed=args.seed,
        )["loss"]
    )
    train_seconds = time.time() - start

    rng = np.random.default_rng(10_000 + args.seed)
    task, observations = problem.sample_tasks(args.test_tasks, args.stages, rng)
    moved, cloud, weights = pfbr.SequentialMonteCarlo().filter(
        problem, task, observations, num_particles=args.particles, seed=args.seed + 1, weighted=True
    )
    runs = (
        {}
        if args.smc_only
        else {
            "PFBR": operator.filter(
                problem, task, observations, num_particles=args.particles, seed=args.seed + 1
            )
        }
    )
    runs.update({"SMC": cloud, "SMC, moved": moved})
    run_weights = {"PFBR": None, "SMC": weights, "SMC, moved": None}
    prior, _ = problem.sample_prior(problem.as_task_tensors(task), args.particles, [args.seed, 7])
    online = {name: np.zeros((args.test_tasks, args.stages)) for name in runs}
    held_out = {name: np.zeros((args.test_tasks, args.stages)) for name in runs}
    for name, particles in runs.items():
        w = run_weights[name]
        for k in range(args.test_tasks):
            rotated_test = problem.rotated(x_test, task["angle"][k])
            for n in range(args.stages):
                before, before_w = (
                    (prior.numpy()[k], None)
                    if n == 0
                    else (particles[n - 1, k], None if w is None else w[n - 1, k])
                )
                batch = observations[k, n]
                online[name][k, n] = np.mean(
                    (problem.predictive_probability(before, batch[:, :-1], before_w) > 0.5)
                    == batch[:, -1]
                )
                held_out[name][k, n] = np.mean(
                    (
                        problem.predictive_probability(
                            particles[n, k], rotated_test, None if w is None else w[n, k]
                        )
                        > 0.5
                    )
                    == y_test
                )
    rows = [
        {
            "method": name,
            "online_accuracy_by_stage": online[name].mean(0).round(4).tolist(),
            "held_out_accuracy_by_stage": held_out[name].mean(0).round(4).tolist(),
            "final_held_out_accuracy": float(held_out[name][:, -1].mean()),
            "final_held_out_accuracy_sem": float(
                held_out[name][:, -1].std() / np.sqrt(args.test_tasks)
            ),
            "mean_online_accuracy": float(online[name].mean()),
        }
        for name in runs
    ]
    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": harness.machine_info(),
        "args": vars(args),
        "train_seconds": train_seconds,
        "meta_training_loss": history,
        "rows": rows,
    }
    shown = sorted({min(n, args.stages - 1) for n in (0, 1, 4, 9, args.stages - 1)})
    lines = [
        "# Online Bayesian logistic regression, digits 8 vs 6 (rotated tasks): PFBR vs one-pass SMC",
        "",
        f"{args.components} PCA components (unit variance), tasks rotate components 0-1 by up to 15 degrees; "
        f"{args.test_tasks} unseen test tasks, batches of {args.batch}, {args.particles} particles for both methods. "
        f"Held-out accuracy on the rotated 30% split after each update (mean over tasks). SMC: its weighted cloud "
        f"before resampling (a weighted predictive); 'SMC, moved': the resampled, Liu-West-moved cloud it carries "
        f"on. "
        + (
            "SMC only (--smc-only: no meta-training)."
            if args.smc_only
            else f"Meta-training: {args.iterations} iterations x {args.tasks} tasks x {args.train_particles} "
            f"particles, {args.stages} stages, {train_seconds / 60:.1f} min."
        ),
        "",
        "| method | "
        + " | ".join(f"after {n + 1} batches" for n in shown)
        + " | mean online accuracy |",
        "|---|" + "---|" * (len(shown) + 1),
    ]
    for row in rows:
        lines.append(
            f"| {row['method']} | "
            + " | ".join(f"{row['held_out_accuracy_by_stage'][n]:.3f}" for n in shown)
            + f" | {row['mean_online_accuracy']:.3f} |"
        )
    lines += ([""] if args.smc_only else ["", "Plot: pfbr_logistic_digits.png.", ""]) + [
        f"Command: `{result['command']}`"
    ]
    print("\n".join(lines))
    harness.save_results(
        "pfbr_logistic_digits_smc" if args.smc_only else "pfbr_logistic_digits", result, lines
    )
    if args.smc_only:
        return

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for name in runs:
        axes[0].plot(np.arange(1, args.stages + 1), online[name].mean(0), label=name)
        axes[1].plot(np.arange(1, args.stages + 1), held_out[name].mean(0), label=name)
    axes[0].set_title("accuracy on the incoming batch (before its update)")
    axes[1].set_title("held-out accuracy after the update")
    for ax in axes:
        ax.set_xlabel("stage")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(harness.RESULTS_DIR, "pfbr_logistic_digits.png"), dpi=90)


if __name__ == "__main__":
    main()
