"""Every optimizer constructed with no arguments, on four tasks, at equal epochs.

Tasks (10 particles, batch 64 unless noted; held-out scores of the posterior predictive):
  mlp       digits MLP 64 -> 50 -> 50 -> 10 (bk.zoo.mlp), 30 epochs (1,347 train / 450 test)
  lenet5    LeNet-5 on the 8x8 digits (bk.zoo.lenet5), 30 epochs
  gru       GRU(32) reading the digit rows (bk.zoo.gru_classifier), 30 epochs
  logreg    breast_cancer logistic regression (one Dense(2) particle layer, 30 features + bias), 30
            epochs, batch 32, 25 % held out
Every optimizer is `Class()` with nothing passed; each method is listed with its vanilla counterpart
(MatrixSVGD with SVGD, PreconditionedParticles with IndependentParticles, MGVBP with MeanFieldVI).

Usage:
    python benchmarks/defaults.py [--tasks mlp lenet5] [--optimizers GPF SVGD] [--seeds 0 1]
    python benchmarks/defaults.py --optimizers GaussianParticleFlow --step-rule '{"class_name": ...}' --stem ...
Writes benchmarks/results/defaults.{json,md}. `--step-rule` (a rule name or a serialized StepRule as JSON)
measures a candidate default: it is passed as the only argument, step_rule=, to every optimizer listed.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_time  # noqa: E402, F401  (sets TF env / logging, puts the repo on sys.path)
import harness  # noqa: E402

import bayes_keras as bk  # noqa: E402
import keras  # noqa: E402

OPTIMIZERS = [
    "GaussianParticleFlow",
    "SVGD",
    "MatrixSVGD",
    "IndependentParticles",
    "PreconditionedParticles",
    "MeanFieldVI",
    "MGVBP",
]
TASKS = ("mlp", "lenet5", "gru", "logreg")


def task(name, seed):
    if name == "logreg":
        (x, y), (xt, yt) = bk.datasets.load_breast_cancer(test_fraction=0.25, seed=seed)
        inputs = keras.Input((x.shape[1],))
        logits = bk.layers.Dense(2, num_particles=10)(inputs)
        return bk.BayesianModel(inputs, logits, likelihood="categorical"), (x, y), (xt, yt), 32
    (x, y), (xt, yt) = bk.datasets.load_digits(image=(name != "mlp"), seed=seed)
    if name == "mlp":
        model = bk.zoo.mlp(64, 10, likelihood="categorical")
    elif name == "lenet5":
        model = bk.zoo.lenet5()
    else:
        model = bk.zoo.gru_classifier()
    return model, (x, y), (xt, yt), 64


def run(task_name, optimizer_name, seed, epochs, step_rule=None):
    keras.utils.set_random_seed(seed)
    model, (x, y), (xt, yt), batch = task(task_name, seed)
    kwargs = {} if step_rule is None else {"step_rule": bk.step_rules.get(step_rule)}
    model.compile(optimizer=getattr(bk.optimizers, optimizer_name)(**kwargs))
    start = time.perf_counter()
    model.fit(x, y, epochs=epochs, batch_size=batch, verbose=0)
    seconds = time.perf_counter() - start
    probs = model.predict(xt, verbose=0)
    nll = float(-np.mean(np.log(np.maximum(probs[np.arange(len(yt)), yt], 1e-12))))
    return {
        "task": task_name,
        "optimizer": optimizer_name,
        "seed": seed,
        "accuracy": float(np.mean(probs.argmax(1) == yt)),
        "nll": nll,
        "seconds": seconds,
        "skipped_updates": int(model.optimizer.skipped_updates.numpy()),
        "skipped_steps": model.skipped_steps,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, default=OPTIMIZERS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", default=harness.RESULTS_DIR)
    parser.add_argument("--stem", default="defaults")
    parser.add_argument(
        "--step-rule",
        default=None,
        help="a step rule for every optimizer listed (name, or a serialized StepRule as JSON)",
    )
    args = parser.parse_args()
    step_rule = (
        json.loads(args.step_rule)
        if args.step_rule and args.step_rule.lstrip().startswith("{")
        else args.step_rule
    )
    rows = []
    for task_name in args.tasks:
        for optimizer_name in args.optimizers:
            for seed in args.seeds:
                row = run(task_name, optimizer_name, seed, args.epochs, step_rule)
                rows.append(row)
                print(json.dumps(row), flush=True)
    lines = [
        f"Every optimizer with no constructor arguments, {args.epochs} epochs, 10 particles, seeds {args.seeds} "
        "(held-out accuracy / NLL of the posterior predictive; mean over seeds"
        + (", ± standard error" if len(args.seeds) > 1 else "")
        + ")",
        "",
        "| optimizer | " + " | ".join(args.tasks) + " |",
        "|---|" + "---|" * len(args.tasks),
    ]
    for optimizer_name in args.optimizers:
        cells = []
        for task_name in args.tasks:
            got = [r for r in rows if r["task"] == task_name and r["optimizer"] == optimizer_name]
            acc, nll = np.array([r["accuracy"] for r in got]), np.array([r["nll"] for r in got])
            if len(got) > 1:
                se = lambda v: v.std(ddof=1) / np.sqrt(len(v))  # noqa: E731
                cells.append(f"{acc.mean():.3f} ± {se(acc):.3f} / {nll.mean():.3f} ± {se(nll):.3f}")
            else:
                cells.append(f"{acc.mean():.3f} / {nll.mean():.3f}")
        label = (
            f"{optimizer_name}()"
            if step_rule is None
            else f"{optimizer_name}(step_rule={bk.step_rules.get(step_rule)!r})"
        )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    harness.save_results(
        args.stem,
        {
            "command": "python " + " ".join(sys.argv),
            "epochs": args.epochs,
            "seeds": args.seeds,
            "step_rule": step_rule,
            "rows": rows,
        },
        text,
        args.out,
    )


if __name__ == "__main__":
    main()
