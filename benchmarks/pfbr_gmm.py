"""PFBR on the two-component Gaussian mixture (bimodal posterior) of Chen, Dai & Song 2019, Section 5.

Protocol: meta-train on GaussianMixtureProblem tasks (x* from the prior, `--train-length`-observation
sequences); test on `--sequences` unseen sequences of `--length` observations drawn at x* = (-1, 2),
whose posterior has modes at (-1, 2) and (1, -2). At every step, for PFBR's particles, one-pass SMC's
(same particle count; scored on its weighted cloud before resampling, with its weights, and, as "SMC, moved",
on the equally weighted cloud it carries on after resampling and the Liu-West move, as earlier versions
scored it) and the exact grid posterior: the mass inside each mode's part of the exact
posterior's 95% highest-density region (HPD; a particle counts for a mode when its grid cell is in the
HPD set and it is nearer that mode; particles in the low-density valley between the modes count for
neither; their sum, the in-HPD mass, is 0.95 for the exact posterior and falls with every particle
left in the valley), and the KDE cross-entropy to the grid posterior (grid points weighted by their probabilities).
A sequence "holds both modes" when the smaller of the two in-HPD masses stays above `--hold` at every
step at which the exact posterior itself holds both (its own smaller in-HPD mass above `--hold`; after the
first few observations the posterior is still one blob), counted to the training length (the paper trains
and shows 30-observation sequences) and to `--length`. Plot: one sequence, particles over
the exact posterior's contours.

Usage:
    python benchmarks/pfbr_gmm.py                         # ~37 min on 2 cores (meta-training)
    python benchmarks/pfbr_gmm.py --load benchmarks/results/pfbr_gmm_operator.keras   # evaluation only
Writes benchmarks/results/pfbr_gmm.{json,md,png}.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

from bayes_keras import pfbr  # noqa: E402

TRUTH = (-1.0, 2.0)


def grid_cross_entropy(particles, points, probabilities, weights=None):
    """-sum_grid p log KDE(particles): the KDE cross-entropy with the grid posterior as p (a weighted KDE,
    Silverman's bandwidth at the effective sample size, when `weights` are given)."""
    keep = probabilities > 1e-8
    log_q = pfbr.kde_log_density(particles, points[keep], weights=weights)
    return float(-np.sum(probabilities[keep] * log_q) / np.sum(probabilities[keep]))


def hpd_mode_masses(problem, points, probabilities, samples, level=0.95, sample_weights=None):
    """(mass in mode 1's part of the HPD set, mass in mode 2's part) for `samples` (M, 2) (weighted by
    `sample_weights` if given, else equally), or for the grid posterior itself when samples is None. The
    HPD set: the grid cells of highest probability holding `level` of the mass; a sample belongs to its
    nearest grid cell (outside the grid: to none)."""
    order = np.argsort(probabilities)[::-1]
    inside = np.zeros(len(points), bool)
    inside[order[: np.searchsorted(np.cumsum(probabilities[order]), level) + 1]] = True
    if samples is None:
        weights, locations, cells = probabilities, points, inside
    else:
        axis = np.unique(points[:, 0])
        step, size = axis[1] - axis[0], len(axis)
        index = np.rint((samples - axis[0]) / step).astype(int)
        on_grid = np.all((index >= 0) & (index < size), axis=1)
        cells = np.zeros(len(samples), bool)
        cells[on_grid] = inside[index[on_grid, 0] * size + index[on_grid, 1]]
        weights = (
            np.full(len(samples), 1.0 / len(samples))
            if sample_weights is None
            else np.asarray(sample_weights, np.float64) / np.sum(sample_weights)
        )
        locations = samples
    modes = problem.modes(TRUTH)
    first = np.linalg.norm(locations - modes[0], axis=-1) <= np.linalg.norm(
        locations - modes[1], axis=-1
    )
    return float(np.sum(weights * (cells & first))), float(np.sum(weights * (cells & ~first)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--train-particles", type=int, default=128)
    parser.add_argument("--train-length", type=int, default=50)
    parser.add_argument("--segment-length", type=int, default=10)
    parser.add_argument(
        "--train-truth-std",
        type=float,
        default=2.0,
        help="spread of the training tasks' latents x* (the prior stays N(0, I))",
    )
    parser.add_argument(
        "--likelihood-value",
        type=int,
        default=1,
        help="1: the operator also sees the centred log-likelihood values (ParticleFlowBayesRule's "
        "likelihood_value), which tell it which mode an observation favours",
    )
    parser.add_argument(
        "--standardize",
        default="full",
        choices=["full", "diagonal"],
        help="the operator's coordinates: whitened by the particles' covariance, or per-coordinate sd",
    )
    parser.add_argument("--sequences", type=int, default=10)
    parser.add_argument("--length", type=int, default=50)
    parser.add_argument("--particles", type=int, default=512)
    parser.add_argument("--hold", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--load", default=None, help="a saved operator (.keras) instead of meta-training"
    )
    parser.add_argument(
        "--save", default=None, help="where to save the meta-trained operator (.keras)"
    )
    args = parser.parse_args()

    problem = pfbr.GaussianMixtureProblem(truth_std=args.train_truth_std)
    start = time.time()
    if args.load:
        import keras

        operator, history = keras.models.load_model(args.load), None
    else:
        operator = pfbr.ParticleFlowBayesRule(
            latent_dim=2,
            likelihood_value=bool(args.likelihood_value),
            standardize="full" if args.standardize == "full" else True,
        )
        history = operator.meta_fit(
            problem,
            iterations=args.iterations,
            tasks_per_iteration=args.tasks,
            num_particles=args.train_particles,
            sequence_length=args.train_length,
            segment_length=args.segment_length,
            seed=args.seed,
        )["loss"]
        if args.save:
            operator.save(args.save)
    train_seconds = time.time() - start

    rng = np.random.default_rng(10_000 + args.seed)
    task, observations = problem.sample_tasks(args.sequences, args.length, rng, truth=TRUTH)
    points, grid = pfbr.grid_posterior(problem, task, observations, lower=-4, upper=4, size=161)
    moved, cloud, cloud_weights = pfbr.SequentialMonteCarlo().filter(
        problem, task, observations, num_particles=args.particles, seed=args.seed + 1, weighted=True
    )
    runs = {
        "PFBR": operator.filter(
            problem, task, observations, num_particles=args.particles, seed=args.seed + 1
        ),
        "SMC": cloud,
        "SMC, moved": moved,
    }
    run_weights = {"PFBR": None, "SMC": cloud_weights, "SMC, moved": None}
    masses = {
        name: np.zeros((args.sequences, args.length)) for name in list(runs) + ["exact (grid)"]
    }
    in_hpd = {name: np.zeros((args.sequences, args.length)) for name in masses}
    cross_entropy = {name: np.zeros((args.sequences, args.length)) for name in runs}
    for k in range(args.sequences):
        for n in range(args.length):
            both = hpd_mode_masses(problem, points, grid[k, n], None)
            masses["exact (grid)"][k, n], in_hpd["exact (grid)"][k, n] = min(both), sum(both)
            for name, particles in runs.items():
                w = None if run_weights[name] is None else run_weights[name][n, k]
                both = hpd_mode_masses(
                    problem, points, grid[k, n], particles[n, k], sample_weights=w
                )
                masses[name][k, n], in_hpd[name][k, n] = min(both), sum(both)
                cross_entropy[name][k, n] = grid_cross_entropy(
                    particles[n, k], points, grid[k, n], w
                )
    bimodal = (
        masses["exact (grid)"] > args.hold
    )  # (sequences, steps): where there are two modes to hold
    after = bimodal.any(
        0
    )  # for the mean / min columns: steps at which some sequence's posterior is bimodal
    first = int(np.argmax(after)) + 1
    rows = []
    for name in masses:
        holds = (masses[name] > args.hold) | ~bimodal
        held = holds.all(1)
        held_trained = holds[:, : args.train_length].all(1)
        rows.append(
            {
                "method": name,
                "sequences_holding_both_modes_to_train_length": int(held_trained.sum()),
                "smaller_mode_mass_mean": float(masses[name][:, after].mean()),
                "smaller_mode_mass_min": float(masses[name][:, after].min()),
                "sequences_holding_both_modes": int(held.sum()),
                "in_hpd_mass_mean": float(in_hpd[name][:, after].mean()),
                "in_hpd_mass_last": float(in_hpd[name][:, -1].mean()),
                "cross_entropy": float(cross_entropy[name].mean())
                if name in cross_entropy
                else None,
                "smaller_mode_mass_by_step": masses[name].mean(0).round(4).tolist(),
            }
        )
    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": harness.machine_info(),
        "args": vars(args),
        "train_seconds": train_seconds,
        "meta_training_loss": history,
        "rows": rows,
    }
    lines = [
        "# PFBR on the bimodal Gaussian-mixture posterior (unseen sequences from x* = (-1, 2))",
        "",
        f"{args.sequences} test sequences of {args.length} observations; {args.particles} particles; SMC: its weighted "
        f"cloud before resampling, masses and KDE (Silverman's bandwidth at the effective sample size) weighted; "
        f"'SMC, moved': its resampled, Liu-West-moved cloud (how earlier versions scored it); exact "
        f"posterior on a 161 x 161 grid over [-4, 4]^2. Smaller mode's mass = the mass inside the exact "
        f"posterior's 95% HPD region around the less populated of (-1, 2) and (1, -2) (particles between the "
        f"modes count for neither); a sequence holds both modes when that mass stays above {args.hold} at every "
        f"step at which the exact posterior's own does (from step {first} on; before, the posterior is one "
        f"blob). Mean / min over steps {first}..{args.length}. "
        + (
            f"Operator loaded from {args.load} (meta-trained by this script, --iterations {args.iterations} "
            f"--train-length {args.train_length})."
            if args.load
            else f"Meta-training: {args.iterations} iterations x {args.tasks} tasks, {args.train_length}-observation "
            f"sequences, {train_seconds / 60:.1f} min."
        ),
        "",
        f"| method | smaller mode's in-HPD mass, mean | min | sequences holding both modes to step {args.train_length} (the training length) | to step {args.length} | in-HPD mass (both modes), mean | at step {args.length} | KDE cross-entropy to the grid posterior |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ce = "-" if row["cross_entropy"] is None else f"{row['cross_entropy']:.3f}"
        lines.append(
            f"| {row['method']} | {row['smaller_mode_mass_mean']:.3f} | {row['smaller_mode_mass_min']:.3f} | "
            f"{row['sequences_holding_both_modes_to_train_length']} / {args.sequences} | "
            f"{row['sequences_holding_both_modes']} / {args.sequences} | {row['in_hpd_mass_mean']:.3f} | "
            f"{row['in_hpd_mass_last']:.3f} | {ce} |"
        )
    lines += [
        "",
        "Plot: pfbr_gmm.png (sequence 0: PFBR particles over the exact posterior's contours).",
        "",
        f"Command: `{result['command']}`",
    ]
    print("\n".join(lines))
    harness.save_results("pfbr_gmm", result, lines)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted({min(n, args.length - 1) for n in (0, 4, 9, 19, args.length - 1)})
    fig, axes = plt.subplots(1, len(steps), figsize=(3.2 * len(steps), 3.2))
    size = int(np.sqrt(len(points)))
    for ax, n in zip(axes, steps):
        ax.contour(
            points[:, 0].reshape(size, size),
            points[:, 1].reshape(size, size),
            grid[0, n].reshape(size, size),
            levels=6,
            cmap="Greys",
        )
        ax.scatter(
            runs["PFBR"][n, 0, :, 0], runs["PFBR"][n, 0, :, 1], s=2, alpha=0.4, color="tab:red"
        )
        ax.set_title(f"after {n + 1} observations")
        ax.set_xlim(-3.5, 3.5)
        ax.set_ylim(-3.5, 3.5)
    fig.suptitle("PFBR particles (red) over the exact posterior (grid contours)")
    fig.tight_layout()
    fig.savefig(os.path.join(harness.RESULTS_DIR, "pfbr_gmm.png"), dpi=90)


if __name__ == "__main__":
    main()
