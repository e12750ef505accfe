"""How low ECE can go on benchmarks/lora_digits.py's test set: the ECE of a perfectly calibrated model with the same
confidences.

For Keras' LoRA (at each seed's tuned Adam rate, 3e-3 / 3e-3 / 1e-2 as lora_digits.py chose) and Bayesian LoRA (GPF,
N = 8), seeds 0-2, the held-out ECE (15 bins) is set beside the ECE of labels drawn from the model's own predictive
probabilities (500 draws): what a model whose probabilities are exactly right would score on 224 test digits. When
both methods' ECE lie inside that band, ECE cannot tell them apart at this test size.

    python benchmarks/lora_digits_ece_floor.py
Writes benchmarks/results/lora_digits_ece_floor.{json,md}.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import harness  # noqa: E402
import lora_digits  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import bayes_keras as bk  # noqa: E402

RATES = {0: 3e-3, 1: 3e-3, 2: 1e-2}  # lora_digits.py's tuned Keras LoRA rates


def calibrated_ece(probs, rng, draws=500):
    return np.array(
        [
            bk.metrics.ece(
                probs, np.array([rng.choice(probs.shape[1], p=row / row.sum()) for row in probs])
            )
            for _ in range(draws)
        ]
    )


def main():
    pretrain, (x, y), (x_test, y_test), _ = lora_digits.split()
    vit = lora_digits.pretrained(pretrain, 60)
    rng = np.random.default_rng(0)
    rows = []
    for seed, rate in RATES.items():
        keras.utils.set_random_seed(seed)
        keras_model = lora_digits.keras_lora(vit, 4, 0.0, rate)
        keras_model.fit(x, y, epochs=30, batch_size=64, verbose=0)
        keras.utils.set_random_seed(seed)
        bayesian = bk.bayesianize(
            lora_digits.fine_tune_model(vit), num_particles=8, lora_rank=4, seed=seed
        )
        bayesian.compile(optimizer=bk.optimizers.GaussianParticleFlow())
        bayesian.fit(x, y, epochs=30, batch_size=64, verbose=0)
        for name, model in (("Keras LoRA", keras_model), ("Bayesian LoRA, GPF", bayesian)):
            probs = model.predict(x_test, verbose=0).astype("float64")
            floor = calibrated_ece(probs, rng)
            rows.append(
                {
                    "seed": seed,
                    "variant": name,
                    "ece": bk.metrics.ece(probs, y_test),
                    "calibrated_mean": float(floor.mean()),
                    "calibrated_5": float(np.percentile(floor, 5)),
                    "calibrated_95": float(np.percentile(floor, 95)),
                }
            )
            print(rows[-1], flush=True)
    lines = [
        "# ECE of Bayesian and Keras LoRA against a perfectly calibrated model's ECE",
        "",
        "`python benchmarks/lora_digits_ece_floor.py`: the runs of benchmarks/lora_digits.py (seeds 0-2); held-out "
        f"ECE (15 bins, {len(y_test)} test digits) and the ECE of labels drawn from each model's own predictive "
        "(500 draws: mean and 5-95% band).",
        "",
        "| seed | variant | ECE | calibrated model: mean | 5-95% |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['seed']} | {r['variant']} | {r['ece']:.4f} | {r['calibrated_mean']:.4f} | "
        f"{r['calibrated_5']:.4f}-{r['calibrated_95']:.4f} |"
        for r in rows
    ]
    paths = harness.save_results(
        "lora_digits_ece_floor", {"rows": rows, "machine": harness.machine_info()}, lines
    )
    print("\n".join(lines))
    print("wrote", *paths)


if __name__ == "__main__":
    main()
