"""examples/transfer_digits.py over seeds: uncertainty on digits 5-9 from a backbone pretrained on digits 0-4.

One MobileNetV2 (alpha 0.35, 32x32x1, weights=None) is pretrained here on scikit-learn's digits 0-4 (random
shifts, seed 0, the "pretrained model" every variant starts from); each seed then fine-tunes on digits 5-9 (the main job's
75/25 split, restricted to 5-9):

  Keras fine-tune                  a new softmax head, Adam(1e-3), all the fine-tuning data
  Keras fine-tune + temperature    the same trained on the first 80%, temperature fitted on the last 20%
  Keras fine-tune, last block      (frozen regime) the head and the last block trained, with and without
                                   temperature: the deterministic counterpart of the Bayesian last block
  MC dropout                       Dropout(0.2) before the head, mean of 10 stochastic forwards
  ensemble of heads                bayesianize(bayesian=["head"]) with IndependentParticles()
  Bayesian head / last block       bayesianize with GaussianParticleFlow() / MGVBP(), their defaults

in two regimes: `frozen` (the backbone frozen) and `finetuned` (the backbone trained too, as one shared
point estimate under the Bayesian part). Scores: held-out accuracy / NLL / ECE (15 bins) on digits 5-9 and
the OOD AUROC of the predictive entropy with the test digits 0-4 as out-of-distribution inputs; mean +- sd
over seeds.

    python benchmarks/transfer_digits.py [--seeds 0 1 2] [--regimes frozen finetuned] [--epochs 20]
                                         [--variants keras keras_block mc_dropout ensemble bayesian] [--merge]
Writes benchmarks/results/transfer_digits.{json,md} (after every regime and seed, so a partial run keeps
what it measured); `--merge` replaces only the rows it re-runs in an existing results file.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import harness  # noqa: E402
import transfer_digits  # noqa: E402

METRICS = ("accuracy", "nll", "ece", "ood_auroc")


def table(results, args, machine, commands):
    lines = [
        f"# Transfer learning on digits: MobileNetV2 (alpha {args.alpha}) pretrained on 0-4, digits 5-9",
        "",
        f"{'; then '.join(f'`{c}`' for c in commands)}; {args.particles} particles, {args.epochs} epochs, batch 64; mean +- sd "
        f"over seeds {args.seeds}. OOD AUROC: predictive entropy, test digits 0-4 as out-of-distribution. "
        f"Machine: {machine['processor']}, {machine['cpu_count']} CPUs, oneDNN {machine['onednn']}.",
        "",
    ]
    for regime, rows in results.items():
        lines += [
            f"## Backbone {regime}",
            "",
            "| variant | seeds | accuracy | NLL | ECE | OOD AUROC |",
            "|---|---|---|---|---|---|",
        ]
        for name, runs in rows.items():
            cells = [
                f"{np.mean([r[m] for r in runs]):.4f} +- {np.std([r[m] for r in runs]):.4f}"
                for m in METRICS
            ]
            lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--regimes", nargs="+", default=["frozen", "finetuned"], choices=("frozen", "finetuned")
    )
    parser.add_argument("--optimizers", nargs="+", default=["GPF", "MGVBP"])
    parser.add_argument("--parts", nargs="+", default=["head", "block"], choices=("head", "block"))
    parser.add_argument("--pretrain-epochs", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--particles", type=int, default=10)
    parser.add_argument("--alpha", type=float, default=0.35)
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(transfer_digits.VARIANTS),
        choices=transfer_digits.VARIANTS,
    )
    parser.add_argument(
        "--merge", action="store_true", help="update the rows re-run in an existing results file"
    )
    parser.add_argument("--out", default="transfer_digits")
    args = parser.parse_args()
    pretrain, finetune, test, ood = transfer_digits.digits_split()
    start = time.perf_counter()
    backbone = transfer_digits.pretrained_backbone(pretrain, args.pretrain_epochs, args.alpha)
    print(f"pretrained in {time.perf_counter() - start:.0f} s", flush=True)
    data = (finetune, test, ood)
    results, machine, commands = {}, harness.machine_info(), [" ".join(sys.argv)]
    path = os.path.join(harness.RESULTS_DIR, args.out + ".json")
    if args.merge and os.path.exists(path):
        with open(path) as f:
            earlier = json.load(f)
        results, commands = (
            earlier["results"],
            earlier.get("commands", [earlier["command"]]) + commands,
        )
    fresh = set()
    for regime in args.regimes:
        rows = results.setdefault(regime, {})
        for seed in args.seeds:
            found = transfer_digits.run_variants(
                backbone,
                data,
                regime,
                args.epochs,
                seed,
                args.particles,
                args.parts,
                args.optimizers,
                args.variants,
            )
            for name, scores in found.items():
                if (regime, name) not in fresh:  # a merged row is replaced, not extended
                    rows[name] = []
                    fresh.add((regime, name))
                rows[name].append(scores)
            print(f"{regime} seed {seed} done at {time.perf_counter() - start:.0f} s", flush=True)
            result = {
                "command": commands[-1],
                "commands": commands,
                "args": vars(args),
                "machine": machine,
                "results": results,
                "seconds": time.perf_counter() - start,
            }
            paths = harness.save_results(args.out, result, table(results, args, machine, commands))
    print("\n".join(table(results, args, machine, commands)))
    print("wrote", *paths)


if __name__ == "__main__":
    main()
