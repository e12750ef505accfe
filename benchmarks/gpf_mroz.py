"""GaussianParticleFlow step rules on a full-batch posterior: Bayesian logistic regression of Mroz's labour
force participation data against a long NUTS run (tests/fixtures/mroz_nuts.json).

Model: `bk.datasets.load_mroz(test_fraction=0, add_bias=True)` (753 rows, 7 standardised covariates + an
intercept, D = 8), Bernoulli likelihood, prior N(0, 5 I). Each run: `GaussianParticleFlow(learning_rate,
structure="full", step_rule=RULE)` through `bk.run_particles`, N = 32 particles started at 0.1 * N(0, I)
(numpy default_rng(seed)), full batch, `--steps` steps. Scores, against the NUTS mean and sd: worst
mean error max_d |m - m_nuts| / sd_nuts and the sd ratios sd / sd_nuts (sd from the particles' 1/N
covariance, the GPF Gaussian's), after every `--report-every` steps; and how much the cloud still
moves at the end: the mean over the last 100 steps of max_d |mean_t - mean_{t-1}| / sd_nuts (a settled
run moves by ~0).

Usage:
    python benchmarks/gpf_mroz.py                                   # the candidates, seeds 0-2 (~5 min)
    python benchmarks/gpf_mroz.py --rules rmsprop adam --seeds 0
Writes benchmarks/results/gpf_mroz.{json,md} (--stem to change).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402

FIXTURE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "mroz_nuts.json"
)
# Candidate rules, by the name used in the table: a registered name, or a factory.
CANDIDATES = {
    "rmsprop": lambda: "rmsprop",
    "adam": lambda: "adam",
    "sgd": lambda: "sgd",
    "signal_rmsprop(0.9)": lambda: bk.step_rules.SignalShare(
        bk.step_rules.DimWiseRMSProp(), decay=0.9
    ),
    "signal_rmsprop(0.97)": lambda: bk.step_rules.SignalShare(
        bk.step_rules.DimWiseRMSProp(), decay=0.97
    ),
    "signal_adam(0.97)": lambda: bk.step_rules.SignalShare(bk.step_rules.DimWiseAdam(), decay=0.97),
    "default": lambda: None,
}


def mroz_log_prob(prior_variance=5.0):
    """(N, 8) -> (N,): Bernoulli log likelihood + N(0, prior_variance I) log prior, up to a constant."""
    (x, y), _ = bk.datasets.load_mroz(test_fraction=0.0, add_bias=True)
    x, y = tf.constant(x), tf.constant(y.astype(np.float32))

    def log_prob(w):
        logits = tf.matmul(w, x, transpose_b=True)
        return (
            tf.reduce_sum(y * logits - tf.math.softplus(logits), axis=1)
            - 0.5 * tf.reduce_sum(w * w, 1) / prior_variance
        )

    return log_prob


def run(rule, seed, steps, num_particles=32, learning_rate=1e-2):
    init = 0.1 * np.random.default_rng(seed).standard_normal((num_particles, 8)).astype(np.float32)
    kwargs = {} if rule is None else {"step_rule": rule}
    opt = bk.optimizers.GaussianParticleFlow(learning_rate, structure="full", **kwargs)
    return bk.run_particles(mroz_log_prob(), init, opt, steps, record_trajectory=True), opt


def scores(particles, ref):
    mean = particles.mean(0)
    sd = np.sqrt(np.mean((particles - mean) ** 2, axis=0))
    ratio = sd / ref["sd"]
    return (
        float(np.max(np.abs(mean - ref["mean"]) / ref["sd"])),
        float(ratio.min()),
        float(ratio.max()),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rules",
        nargs="+",
        default=[
            "rmsprop",
            "adam",
            "signal_rmsprop(0.97)",
            "signal_rmsprop(0.9)",
            "signal_adam(0.97)",
        ],
        choices=sorted(CANDIDATES),
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--report-every", type=int, default=500)
    parser.add_argument("--stem", default="gpf_mroz")
    parser.add_argument(
        "--reference", default=FIXTURE, help="the NUTS fixture (tests/fixtures/make_mroz_nuts.py)"
    )
    args = parser.parse_args()
    with open(args.reference) as f:
        ref = {k: np.asarray(v) if isinstance(v, list) else v for k, v in json.load(f).items()}

    rows = []
    for name in args.rules:
        for seed in args.seeds:
            result, opt = run(
                CANDIDATES[name](), seed, args.steps, learning_rate=args.learning_rate
            )
            trajectory = result.trajectory
            checkpoints = {
                t: scores(trajectory[t], ref)
                for t in range(args.report_every, args.steps + 1, args.report_every)
            }
            means = trajectory[-101:].mean(1)
            movement = float(np.mean(np.max(np.abs(np.diff(means, axis=0)) / ref["sd"], axis=1)))
            error, low, high = scores(result.particles, ref)
            rows.append(
                {
                    "rule": name,
                    "step_rule": repr(opt.step_rule),
                    "seed": seed,
                    "worst_mean_error": error,
                    "sd_ratio_min": low,
                    "sd_ratio_max": high,
                    "final_movement_in_sds": movement,
                    "skipped_steps": int(result.skipped_steps),
                    "free_energy_final": float(result.free_energy[-1]),
                    "by_step": {str(t): v for t, v in checkpoints.items()},
                }
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "by_step"}), flush=True)

    lines = [
        "# GaussianParticleFlow on Mroz's logistic regression (full batch) against NUTS",
        "",
        f"D = 8 (7 standardised covariates + intercept, 753 rows, prior N(0, 5 I)); N = 32 particles from "
        f'0.1 * N(0, I), `GaussianParticleFlow({args.learning_rate:g}, structure="full", step_rule=...)`, '
        f"{args.steps} full-batch steps, seeds {args.seeds}. Worst mean error = max over the 8 weights of "
        "|m - m_NUTS| / sd_NUTS; sd ratios sd / sd_NUTS (1/N particle covariance), min - max over the weights; "
        "movement = mean over the last 100 steps of the largest step-to-step change of the particle mean, in "
        "NUTS sds. Reference: tests/fixtures/mroz_nuts.json "
        f"({ref['num_draws']} NUTS draws, split R-hat {ref['rhat_max']:.5f}, min ESS {ref['ess_min']:.0f}; "
        f"Monte Carlo error at most {ref['mcse_mean_max']:.4f} sd on a mean, {100 * ref['mcse_sd_max']:.2f} % on an sd).",
        "",
        "| step rule | seed | worst mean error (sds) | sd ratio min - max | movement at the end (sds/step) | "
        + " | ".join(
            f"error at {t}" for t in range(args.report_every, args.steps, args.report_every)
        )
        + " |",
        "|---|---|---|---|---|"
        + "---|" * len(range(args.report_every, args.steps, args.report_every)),
    ]
    for row in rows:
        lines.append(
            f"| {row['rule']} | {row['seed']} | {row['worst_mean_error']:.3f} | {row['sd_ratio_min']:.3f} - "
            f"{row['sd_ratio_max']:.3f} | {row['final_movement_in_sds']:.1e} | "
            + " | ".join(
                f"{row['by_step'][str(t)][0]:.3f}"
                for t in range(args.report_every, args.steps, args.report_every)
            )
            + " |"
        )
    lines += ["", f"Command: `python {' '.join(sys.argv)}`"]
    print("\n".join(lines))
    harness.save_results(
        args.stem,
        {
            "command": "python " + " ".join(sys.argv),
            "machine": harness.machine_info(),
            "args": vars(args),
            "rows": rows,
        },
        lines,
    )


if __name__ == "__main__":
    main()
