"""Seconds per training step of the Gaussian-VI optimizers vs. independent particles, paired.

What is measured: the wall-clock time of ONE optimisation step (forward, backward, optimizer update,
metric bookkeeping) of a bayes_keras BayesianModel with N particles on a fixed batch of 64
scikit-learn digits, for three optimizers on the same model:

  (a) ip      bk.optimizers.IndependentParticles(1e-3)                 the reference (deep ensemble)
  (m) mgvbp   bk.optimizers.MGVBP(1e-3, structure="diagonal")          natural-gradient Gaussian VI
  (v) mfvi    bk.optimizers.MeanFieldVI(1e-3)                          reparameterised mean-field VI

For the Gaussian-VI optimizers (m, v) the N particles are the N samples of q drawn each step: the step
also updates q's parameters (float64 optimizer state) and writes N fresh samples into the particles.
Models: the MLP (64 -> 50 -> 50 -> 10, relu) and LeNet-5 (8x8x1) of benchmarks/step_time.py, N in
{5, 10, 20}. Acceptance target: the MGVBP diagonal step costs at most 1.2 x the IndependentParticles
step with the same N (paired ratio m/a <= 1.2, per (model, N)).

How: the machinery of benchmarks/step_time.py (imported, not copied). Every model is built and
compiled as there (default settings: Keras turns XLA off on CPU-only machines), traced and warmed up,
then driven the way `fit` drives it, `model.train_function(iterator)` on one persistent tf.data
iterator per architecture repeating the fixed batch. The three variants of one (model, N) form a
group; in every round each group is visited once (groups in shuffled order) and each of its
variants runs a block of `--steps` consecutive steps, back to back in shuffled order, so the blocks
of a visit see the same machine state. Reported: the median per-step time (block wall time / steps)
over `--rounds` rounds, and the ratios m/a and v/a as the median over rounds of the ratio WITHIN a
visit (paired), which cancels slow phases of a shared machine.

Usage:
    python benchmarks/gaussian_vi_step_time.py            # full run (a few minutes on 2 CPU cores)
    python benchmarks/gaussian_vi_step_time.py --quick    # smoke run
    python benchmarks/gaussian_vi_step_time.py --policy mixed_bfloat16   # under a Keras dtype policy
Writes benchmarks/results/gaussian_vi_step_time.{json,md}; a policy other than float32, or
TF_ENABLE_ONEDNN_OPTS set, adds a suffix (e.g. gaussian_vi_step_time_mixed_bfloat16_onednn_off.md).
"""

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_time as st  # noqa: E402  (sets TF env / logging, puts the repo on sys.path)
import harness  # noqa: E402

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

bk = st.bk

STEM = "gaussian_vi_step_time"
TARGET = 1.2  # MGVBP diagonal step <= TARGET x IndependentParticles step, same N
VARIANTS = {  # key -> (letter, description, optimizer factory)
    "ip": ("a", "IndependentParticles(1e-3)", lambda: bk.optimizers.IndependentParticles(1e-3)),
    "mgvbp": (
        "m",
        "MGVBP(1e-3, structure='diagonal')",
        lambda: bk.optimizers.MGVBP(1e-3, structure="diagonal"),
    ),
    "mgvbp_ef": (
        "f",
        "MGVBP(1e-3, structure='diagonal', curvature='empirical_fisher')",
        lambda: bk.optimizers.MGVBP(1e-3, structure="diagonal", curvature="empirical_fisher"),
    ),
    "mfvi": ("v", "MeanFieldVI(1e-3)", lambda: bk.optimizers.MeanFieldVI(1e-3)),
}
RATIOS = (("m/a", "mgvbp", "ip"), ("f/a", "mgvbp_ef", "ip"), ("v/a", "mfvi", "ip"))


def build_groups(archs, ns, warmup):
    groups, variants = [], []
    for arch in archs:
        x, y, dataset_size = st.fixed_batch(arch)
        iterator = iter(tf.data.Dataset.from_tensors((x, y)).repeat())  # shared, as in step_time.py
        for n in ns:
            members = {}
            for key, (_, _, factory) in VARIANTS.items():
                model = st.bayesian_model(arch, n, factory(), dataset_size)
                # As BayesianModel.fit does before tracing: the Gaussian-VI optimizers initialise q
                # from the particle weights and must be built before the step is traced.
                model.optimizer.build(model.trainable_variables)
                v = st.Variant(
                    arch, key, n, [model], [st.make_stepper(model, x, y, "fit", iterator)]
                )
                for _ in range(warmup + 1):  # the first call traces
                    harness.sync(v.step())
                variants.append(v)
                members[key] = v
                print(f"  built {v.name}", flush=True)
            groups.append(st.Group(arch, n, members))
    return groups, variants


def targets(rows):
    out = {}
    for r in rows:
        for ratio in ("m/a", "f/a"):
            q = r["ratios"][ratio]
            out[f"{ratio[0]} <= {TARGET} a ({r['model']}/N={r['N']})"] = {
                "ratio": round(q, 4),
                "pass": bool(q <= TARGET),
            }
    return out


def method_note(args):
    return (
        "Method: every variant is a bayes_keras BayesianModel (bk.zoo.mlp / bk.zoo.lenet5 with N particles, "
        "built and compiled as in benchmarks/step_time.py, default compile settings: no XLA on a CPU-only "
        "machine) driven by its own compiled train function, `model.train_function(iterator)` on a persistent "
        f"tf.data iterator repeating one fixed batch of {st.BATCH_SIZE} scikit-learn digits (what `fit` "
        f"executes per step), after a tracing step and {args.warmup} warm-up steps. The three variants of a row "
        f"are timed back to back in shuffled order, {args.steps} consecutive steps each, once per round, for "
        f"{args.rounds} rounds (rows visited in shuffled order). Times are medians over rounds of block time / "
        "steps; ratios are medians over rounds of the ratio within a round (paired, so that phases in which "
        "another process slows the shared machine cancel); the JSON also has ratios of medians and of minima. "
        "The Gaussian-VI steps (m, v) include updating q's float64 parameters, drawing N new samples from q and "
        f"writing them into the particle variables, and the ELBO metric. Target: m/a and f/a <= {TARGET} for every row."
    )


def stem(args):
    suffix = "" if args.policy == "float32" else f"_{args.policy}"
    if harness.onednn_setting() != "default":
        suffix += f"_onednn_{harness.onednn_setting()}"
    return STEM + suffix


def set_policy(name):
    """A Keras dtype policy as users set it: floatx for float64, the global policy for mixed ones."""
    keras.config.set_floatx("float64" if name == "float64" else "float32")
    keras.mixed_precision.set_global_policy(name)


def write_results(args, result, table):
    st.write_report(
        args.out,
        stem(args),
        result,
        "Seconds per training step: Gaussian-VI optimizers vs. independent particles",
        "Milliseconds per step (median), same BayesianModel and N, optimizer varied: "
        + "; ".join(f"({letter}) {k}: bk.optimizers.{d}" for k, (letter, d, _) in VARIANTS.items())
        + ".",
        table,
        method_note(args),
        machine_extra=f"; dtype policy {args.policy}; total run time "
        f"{result['timing']['total_s']:.0f} s",
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved timing rounds (default 40; quick 4)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per timed block (default 10; quick 5)"
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed steps per variant after the tracing step"
    )
    parser.add_argument(
        "--particles", type=int, nargs="+", default=None, help="values of N (default 5 10 20)"
    )
    parser.add_argument("--models", nargs="+", choices=st.ARCHS, default=list(st.ARCHS))
    parser.add_argument("--quick", action="store_true", help="smoke run (few rounds, short blocks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=harness.RESULTS_DIR, help="results directory")
    parser.add_argument(
        "--policy",
        default="float32",
        choices=["float32", "mixed_bfloat16", "mixed_float16", "float64"],
        help="Keras dtype policy of every model",
    )
    args = parser.parse_args(argv)
    set_policy(args.policy)
    args.rounds = args.rounds or (4 if args.quick else 40)
    args.steps = args.steps or (5 if args.quick else 10)
    ns = args.particles or [5, 10, 20]

    keras.utils.set_random_seed(args.seed)
    load_at_start = harness.load_average()
    t_start = time.perf_counter()
    print("Building and warming up variants ...", flush=True)
    groups, variants = build_groups(args.models, ns, args.warmup)
    t_built = time.perf_counter()

    st.run_rounds(groups, args.rounds, args.steps, args.seed, t_start)

    rows = st.summarise(groups, VARIANTS, RATIOS)
    table = st.markdown_table(
        rows,
        VARIANTS,
        RATIOS,
        extra_columns=[
            (f"m/a <= {TARGET}", lambda r: "PASS" if r["ratios"]["m/a"] <= TARGET else "FAIL"),
            (f"f/a <= {TARGET}", lambda r: "PASS" if r["ratios"]["f/a"] <= TARGET else "FAIL"),
        ],
    )
    checks = targets(rows)
    print("\n" + table + "\n")
    for name, c in checks.items():
        print(f"  {'PASS' if c['pass'] else 'FAIL'}  {name}: {c['ratio']:.3f}")

    command = " ".join(
        ["python", "benchmarks/gaussian_vi_step_time.py"]
        + (sys.argv[1:] if argv is None else list(argv))
    )
    result = {
        "description": (
            "seconds per training step: median over interleaved rounds; ratios are medians of "
            "per-round paired ratios"
        ),
        "settings": {
            "batch_size": st.BATCH_SIZE,
            "rounds": args.rounds,
            "steps_per_block": args.steps,
            "warmup_steps": args.warmup,
            "particles": ns,
            "models": args.models,
            "driver": "fit",
            "seed": args.seed,
            "quick": args.quick,
            "target_m_over_a": TARGET,
            "policy": args.policy,
            "command": command,
        },
        "variants": {
            k: {"letter": letter, "description": f"bk.optimizers.{d}"}
            for k, (letter, d, _) in VARIANTS.items()
        },
        "jit_compile": {v.name: v.jit_compile for v in variants},
        "rows": rows,
        "raw_seconds_per_step": {v.name: v.samples for v in variants},
        "raw_visits": [{"model": g.arch, "N": g.n, "visits": g.visits} for g in groups],
        "targets": checks,
        "machine": harness.machine_info(),
        "timing": {
            "load_average_at_start": load_at_start,
            "build_and_warmup_s": t_built - t_start,
            "total_s": time.perf_counter() - t_start,
        },
    }
    write_results(args, result, table)
    print(
        f"\nWrote {args.out}/{stem(args)}.json and .md ({time.perf_counter() - t_start:.0f} s total)"
    )


if __name__ == "__main__":
    main()
    gc.freeze()  # skip the slow interpreter-shutdown walk over the traced models (as step_time.py)
