"""PFBR on a 10-D linear dynamical system (the setting of Table 1 of Chen, Dai & Song 2019) against
bootstrap SMC with 256 and 8192 particles, on systems drawn fresh (never trained on), or with
`--fixed-system SEED` on one system drawn once and used for training and test, as in the paper's Table 1.

Protocol: meta-train one ParticleFlowBayesRule on LinearDynamicalSystemProblem tasks (every task its own
A, B; 10-observation sequences); then for `--sequences` test sequences of `--length` observations, each
from a new (A, B): filter with PFBR (256 particles), SMC (256) and SMC (8192); at every step, the
cross-entropy -E_p[log KDE(particles)] to the Kalman posterior p (Silverman bandwidth, `--mc-samples`
draws of p; the paper's metric, averaged over steps and sequences as in its Table 1). References: the
same metric for exact draws of p at each method's particle count (the floor moves with N: the KDE's bandwidth
shrinks as N grows) and p's entropy; and the posterior's moments: the particles' mean error in Kalman sds and
their sd ratio. SMC is scored on its weighted cloud (each stage's particles and normalised importance weights
before resampling: a weighted KDE whose Silverman bandwidth uses the effective sample size, weighted moments);
its resampled cloud, which repeats a few particles many times yet gets the bandwidth of N distinct ones, is
reported beside it as "SMC, resampled" (how earlier versions of this table scored SMC). CPU time
per update: one filter() call over one sequence after a warm-up call, divided by its length (both
methods' stages compiled once and cached; PFBR: propagation + flow, XLA-compiled; SMC: propagation +
weighting + resampling).

Usage:
    python benchmarks/pfbr_lds.py                      # ~15 min on 2 cores
    python benchmarks/pfbr_lds.py --iterations 50 --sequences 3   # smoke run
    python benchmarks/pfbr_lds.py --fixed-system 0     # the paper's protocol: one (A, B) throughout
Writes benchmarks/results/pfbr_lds.{json,md} (pfbr_lds_fixed.{json,md} with --fixed-system); the operator to
--save (default: not kept).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

from bayes_keras import pfbr  # noqa: E402


def time_per_update(method, problem, task, observations, num_particles, seed):
    """Wall time per update in the steady state: one filter() call over the whole sequence, after a warm-up
    call on the same shapes that compiles (and caches) both methods' stages, divided by its length."""
    method.filter(problem, task, observations, num_particles=num_particles, seed=seed)
    start = time.perf_counter()
    method.filter(problem, task, observations, num_particles=num_particles, seed=seed + 1)
    return (time.perf_counter() - start) / observations.shape[1]


def moment_errors(particles, mean, covariance, weights=None):
    """(mean error in posterior sds, sd ratio), averaged over the coordinates, of particles (N, d), weighted
    by `weights` if given, against the Kalman posterior N(mean, covariance)."""
    sd = np.sqrt(np.diag(covariance))
    cloud_mean, cloud_sd = pfbr.weighted_moments(particles, weights)
    return float(np.mean(np.abs(cloud_mean - mean) / sd)), float(np.mean(cloud_sd / sd))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=600)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per meta-training iteration")
    parser.add_argument("--train-particles", type=int, default=64)
    parser.add_argument("--train-length", type=int, default=10)
    parser.add_argument("--sequences", type=int, default=25)
    parser.add_argument("--length", type=int, default=25)
    parser.add_argument("--mc-samples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--load", default=None, help="a saved operator (.keras) instead of meta-training"
    )
    parser.add_argument(
        "--save", default=None, help="where to save the meta-trained operator (.keras)"
    )
    parser.add_argument(
        "--fixed-system",
        type=int,
        default=None,
        metavar="SEED",
        help="train and test on one (A, B), drawn with this seed (the paper's Table 1 protocol)",
    )
    args = parser.parse_args()

    problem = pfbr.LinearDynamicalSystemProblem(dim=args.dim)
    if args.fixed_system is not None:
        system = problem.sample_system(np.random.default_rng(args.fixed_system))
        problem = pfbr.LinearDynamicalSystemProblem(dim=args.dim, system=system)
    start = time.time()
    if args.load:
        import keras

        operator = keras.models.load_model(args.load)
        history = None
    else:
        operator = pfbr.ParticleFlowBayesRule(latent_dim=args.dim)
        history = operator.meta_fit(
            problem,
            iterations=args.iterations,
            tasks_per_iteration=args.tasks,
            num_particles=args.train_particles,
            sequence_length=args.train_length,
            seed=args.seed,
        )["loss"]
        if args.save:
            operator.save(args.save)
    train_seconds = time.time() - start

    rng = np.random.default_rng(
        10_000 + args.seed
    )  # test systems: a stream the training never drew from
    task, observations = problem.sample_tasks(args.sequences, args.length, rng)
    means, covariances = problem.exact_posterior(task, observations)
    methods = {
        ("PFBR", 256): operator,
        ("SMC", 256): pfbr.SequentialMonteCarlo(),
        ("SMC", 8192): pfbr.SequentialMonteCarlo(),
    }
    clouds, weights = {}, {}  # key -> (L, B, N, d) particles, (L, B, N) weights or None
    for key, method in methods.items():
        if key[0] == "SMC":
            resampled, clouds[key], weights[key] = method.filter(
                problem, task, observations, num_particles=key[1], seed=args.seed + 1, weighted=True
            )
            clouds[("SMC, resampled", key[1])], weights[("SMC, resampled", key[1])] = (
                resampled,
                None,
            )
        else:
            clouds[key] = method.filter(
                problem, task, observations, num_particles=key[1], seed=args.seed + 1
            )
            weights[key] = None
    sizes = sorted({key[1] for key in methods})
    keys = list(clouds) + [("exact draws", n) for n in sizes]
    cross_entropy = {key: np.zeros((args.sequences, args.length)) for key in keys}
    mean_error = {key: np.zeros((args.sequences, args.length)) for key in keys}
    sd_ratio = {key: np.zeros((args.sequences, args.length)) for key in keys}
    effective = {
        key: np.zeros((args.sequences, args.length)) for key in keys
    }  # ESS, or distinct particles
    entropy = np.zeros((args.sequences, args.length))
    floor_rng = np.random.default_rng(
        20_000 + args.seed
    )  # exact draws beyond 256: their own stream
    for k in range(args.sequences):
        for n in range(args.length):
            target = rng.multivariate_normal(means[k, n], covariances[k, n], args.mc_samples)
            exact = {256: rng.multivariate_normal(means[k, n], covariances[k, n], 256)}
            for size in sizes:
                if size not in exact:
                    exact[size] = floor_rng.multivariate_normal(
                        means[k, n], covariances[k, n], size
                    )
            for key in keys:
                cloud = exact[key[1]] if key[0] == "exact draws" else clouds[key][n, k]
                w = None if key[0] == "exact draws" else weights[key]
                w = None if w is None else w[n, k]
                cross_entropy[key][k, n] = pfbr.kde_cross_entropy(cloud, target, weights=w)
                mean_error[key][k, n], sd_ratio[key][k, n] = moment_errors(
                    cloud, means[k, n], covariances[k, n], w
                )
                effective[key][k, n] = (
                    pfbr.effective_sample_size(w)
                    if w is not None
                    else len(np.unique(cloud, axis=0))
                )
            entropy[k, n] = 0.5 * np.linalg.slogdet(2 * np.pi * np.e * covariances[k, n])[1]
        print(f"sequence {k + 1}/{args.sequences} scored", flush=True)
    one = {key: value[:1] for key, value in task.items()}
    seconds = {
        key: time_per_update(method, problem, one, observations[:1], key[1], args.seed)
        for key, method in methods.items()
    }

    rows = []
    for key in keys:
        floor = cross_entropy[("exact draws", key[1])]
        excess = (cross_entropy[key] - floor).mean(1)  # per sequence, paired with the floor's draws
        finite = np.isfinite(cross_entropy[key]).all() and np.abs(cross_entropy[key]).max() < 1e6
        rows.append(
            {
                "algorithm": key[0],
                "particles": key[1],
                "cpu_seconds_per_update": seconds.get(key),
                "scored_as": (
                    "weighted cloud before resampling (weighted KDE, ESS bandwidth)"
                    if key[0] == "SMC"
                    else "resampled cloud (equal weights, N-point bandwidth)"
                    if key[0] == "SMC, resampled"
                    else "equally weighted cloud"
                ),
                "mean_error_in_sds": float(mean_error[key].mean()),
                "sd_ratio": float(sd_ratio[key].mean()),
                "cross_entropy": float(cross_entropy[key].mean()),
                "cross_entropy_sem": float(
                    cross_entropy[key].mean(1).std() / np.sqrt(args.sequences)
                ),
                "cross_entropy_median": float(np.median(cross_entropy[key])),
                "cross_entropy_finite": bool(finite),
                "floor_at_same_n": float(floor.mean()),
                "excess_over_floor": float(excess.mean()),
                "excess_over_floor_sem": float(excess.std() / np.sqrt(args.sequences)),
                "effective_or_distinct_particles_median": float(np.median(effective[key])),
                "effective_or_distinct_particles_min": float(np.min(effective[key])),
                "cross_entropy_by_step": cross_entropy[key].mean(0).round(4).tolist(),
            }
        )
    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": harness.machine_info(),
        "args": vars(args),
        "train_seconds": train_seconds,
        "meta_training_loss": history,
        "posterior_entropy": float(entropy.mean()),
        "rows": rows,
    }
    fixed = args.fixed_system is not None
    setting = "one fixed system, the paper's protocol" if fixed else "fresh systems"
    sequences = (
        f"{args.sequences} test sequences of {args.length} observations (new states and observations) of "
        f"the one (A, B) the operator was trained on (drawn with seed {args.fixed_system}: A's spectral "
        f"radius {problem.transition_radius}, B's entries x {problem.observation_scale})"
        if fixed
        else f"{args.sequences} test sequences of {args.length} observations, each from an (A, B) never trained on"
    )
    lines = [
        f"# PFBR vs SMC on a {args.dim}-D linear dynamical system (Table 1 setting, {setting})",
        "",
        f"{sequences}; "
        f"cross-entropy to the Kalman posterior through a KDE of the particles ({args.mc_samples} posterior draws), "
        f"mean over steps and sequences (+- standard error over sequences); the mean error (in Kalman "
        f"posterior sds) and sd ratio to the Kalman posterior, averaged over coordinates, steps and sequences; "
        f"CPU seconds per update: one sequence filtered by one filter() call after a warm-up call (both "
        f"methods' stages compiled and cached: steady state), divided by its length, 2 CPU cores. Mean "
        f"entropy of the Kalman posteriors: {entropy.mean():.2f}. "
        + (
            f"Operator loaded from {args.load} (meta-trained by this script, --iterations {args.iterations})."
            if args.load
            else f"Meta-training: {args.iterations} iterations x {args.tasks} tasks x {args.train_particles} particles, "
            f"{args.train_length}-observation sequences, {train_seconds / 60:.1f} min."
        ),
        "",
        "SMC is scored on its weighted cloud (particles and importance weights before resampling; weighted "
        "KDE with Silverman's bandwidth at the effective sample size; weighted moments); 'SMC, resampled' scores "
        "the same filter's resampled cloud as earlier versions of this table did (equal weights, the bandwidth of "
        "N distinct points). Floor: the same metric for exact draws of the Kalman posterior at the same N "
        "(the KDE's bandwidth, and so the floor, falls with N); excess = cross-entropy - floor, paired per step, "
        "+- standard error over sequences. ESS / distinct: median (min) over steps and sequences of the effective "
        "sample size (weighted clouds) or of the number of distinct particles.",
        "",
        "| Algo | #particles | scored as | mean error (sds) | sd ratio | cross-entropy | floor at this N | "
        "excess over floor | ESS / distinct | cpu time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    short = {
        "SMC": "weighted",
        "SMC, resampled": "resampled",
        "PFBR": "particles",
        "exact draws": "-",
    }
    for row in rows:
        t = "-" if row["cpu_seconds_per_update"] is None else f"{row['cpu_seconds_per_update']:.4f}"
        if row["cross_entropy_finite"]:
            ce = f"{row['cross_entropy']:.2f} +- {row['cross_entropy_sem']:.2f}"
            excess = f"{row['excess_over_floor']:.2f} +- {row['excess_over_floor_sem']:.2f}"
        else:
            ce = f"degenerate (mean {row['cross_entropy']:.1e}; median {row['cross_entropy_median']:.0f})"
            excess = "-"
        lines.append(
            f"| {row['algorithm']} | {row['particles']} | {short[row['algorithm']]} | "
            f"{row['mean_error_in_sds']:.3f} | {row['sd_ratio']:.3f} | {ce} | {row['floor_at_same_n']:.2f} | "
            f"{excess} | {row['effective_or_distinct_particles_median']:.0f} "
            f"({row['effective_or_distinct_particles_min']:.0f}) | {t} |"
        )
    lines += [
        "",
        "Paper (Table 1, the authors' fixed system, CPU): PFBR 256 0.23 s 16.56; SMC 256 0.07 s 26.78; "
        "SMC 8192 3.87 s 17.60.",
        "",
        f"Command: `{result['command']}`",
    ]
    print("\n".join(lines))
    harness.save_results("pfbr_lds_fixed" if fixed else "pfbr_lds", result, lines)


if __name__ == "__main__":
    main()
