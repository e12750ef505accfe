"""Bayesian LoRA on a small vision transformer: pretrained here on digits 0-4, fine-tuned on digits 5-9.

The network is bk.zoo.keras_vision_transformer (8x8x1 digits, 16 patches of 2x2, dim 32, 2 blocks, 18k weights),
pretrained on scikit-learn's digits 0-4 (no downloads; random shifts; seed 0). Every variant then adapts the
query and value projections of both attention blocks with rank-4 LoRA factors and trains a new 5-class head on
digits 5-9 (the main job's 75/25 split restricted to 5-9), everything else frozen; per seed:

  LoRA                     Keras' own enable_lora(4) on query / value, a new Dense head, Adam at the learning
                           rate (of 1e-3, 3e-3, 1e-2) with the best NLL on the last 20% when trained on the first 80%
  LoRA + temperature       the same trained on the first 80%, its temperature fitted on the last 20%
  LoRA + MC dropout        Dropout(0.2) before the head, mean of 10 stochastic forwards
  LoRA ensemble            bayesianize(lora_rank=4, num_particles=8) with IndependentParticles at the tuned Adam
                           rate (8 LoRA fine-tunes and heads in one model)
  Bayesian LoRA            bayesianize(lora_rank=4, num_particles=8) with MGVBP(structure="diagonal"), SVGD(),
                           GaussianParticleFlow(): their defaults

Scores: held-out accuracy / NLL / ECE (15 bins) on digits 5-9 and the OOD AUROC of the predictive entropy with
the test digits 0-4 as out-of-distribution inputs; mean +- sd over seeds. Then the cost, measured side by side
(harness.interleaved_microseconds, one fixed batch of 64 and one of 512, each variant's compiled train function;
the larger batch shows the compute-bound regime, where the shared part is only what runs before the particle
axis: the patch embedding, the first norm and the first block's key projection, about 9% of a forward): the fit step
of one Keras LoRA model, of Bayesian LoRA (GPF, N = 8), of 8 separate Keras LoRA models stepped one after another
(8 LoRA fine-tunes), and of one Keras LoRA model on a batch 8 times larger (the same arithmetic as the 8 fine-tunes in
one step: the floor of any N-model method without shared work), with the trainable bytes of each.

    python benchmarks/lora_digits.py [--seeds 0 1 2] [--epochs 30] [--particles 8] [--rank 4]
Writes benchmarks/results/lora_digits.{json,md}.
"""

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import harness  # noqa: E402

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402
from transfer_digits import entropy, fit_temperature  # noqa: E402

METRICS = ("accuracy", "nll", "ece", "ood_auroc")
# the ensemble's Adam gets the learning rate tuned for Keras' LoRA (the same baseline, N times); the Bayesian
# methods run with their defaults
BAYESIAN = {
    "LoRA ensemble (IndependentParticles)": lambda rate: bk.optimizers.IndependentParticles(rate),
    "Bayesian LoRA, MGVBP diagonal": lambda rate: bk.optimizers.MGVBP(structure="diagonal"),
    "Bayesian LoRA, SVGD": lambda rate: bk.optimizers.SVGD(),
    "Bayesian LoRA, GPF": lambda rate: bk.optimizers.GaussianParticleFlow(),
}


def split():
    """(pretraining 0-4, fine-tuning 5-9, 5-9 test, 0-4 test as OOD), 8x8 digits."""
    (x, y), (x_test, y_test) = bk.datasets.load_digits()
    old, new, new_test = y < 5, y >= 5, y_test >= 5
    return (
        (x[old], y[old]),
        (x[new], y[new] - 5),
        (x_test[new_test], y_test[new_test] - 5),
        x_test[y_test < 5],
    )


def pretrained(pretrain, epochs):
    keras.utils.set_random_seed(0)
    vit = bk.zoo.keras_vision_transformer(num_classes=5)
    augmented = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.RandomTranslation(0.1, 0.1, seed=0), vit]
    )
    augmented.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    augmented.fit(*pretrain, epochs=epochs, batch_size=64, verbose=0)
    return vit


def fine_tune_model(vit, dropout=0.0):
    """The Keras model users start from: the pretrained ViT up to its pooled features, frozen, and a new 5-class
    softmax head named 'head'."""
    copy = keras.models.clone_model(vit)
    copy.set_weights(vit.get_weights())
    features = keras.Model(copy.input, copy.get_layer("pool").output)
    features.trainable = False
    inputs = keras.Input((8, 8, 1))
    h = features(inputs)
    if dropout:
        h = keras.layers.Dropout(dropout)(h)
    return keras.Model(inputs, keras.layers.Dense(5, activation="softmax", name="head")(h))


def keras_lora(vit, rank, dropout=0.0, learning_rate=1e-3):
    """Keras' own LoRA: enable_lora on every attention's query and value, the head trainable."""
    model = fine_tune_model(vit, dropout)
    features = model.layers[1]
    features.trainable = True
    for layer in features.layers:
        if not isinstance(layer, keras.layers.MultiHeadAttention):
            layer.trainable = False
            continue
        for projection in (layer.key_dense, layer.output_dense):
            projection.trainable = False
        for projection in (layer.query_dense, layer.value_dense):
            projection.enable_lora(rank)
            projection.bias.trainable = (
                False  # as in Bayesian LoRA: only the factors (and the head) train
            )
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy")
    return model


def scores(probs, probs_ood, y):
    s = bk.metrics.evaluate_probs(probs.astype("float32"), y)
    s["ood_auroc"] = bk.metrics.auroc(entropy(probs), entropy(probs_ood))
    return {k: float(v) for k, v in s.items() if k in METRICS}


def run_seed(vit, data, seed, args):
    (x, y), (x_test, y_test), x_ood = data
    found = {}

    def lora_fit(x_fit, y_fit, dropout=0.0, learning_rate=None):
        keras.utils.set_random_seed(seed)
        model = keras_lora(vit, args.rank, dropout, learning_rate or found["learning_rate"])
        model.fit(x_fit, y_fit, epochs=args.epochs, batch_size=64, verbose=0)
        return model

    # Keras' LoRA gets its Adam learning rate tuned: the one with the best validation NLL (trained on the first 80%,
    # scored on the last 20%), then used by every Keras LoRA variant of this seed
    cut = int(0.8 * len(x))
    validation = {}
    for rate in args.keras_rates:
        model = lora_fit(x[:cut], y[:cut], learning_rate=rate)
        validation[rate] = float(
            bk.metrics.evaluate_probs(model.predict(x[cut:], verbose=0), y[cut:])["nll"]
        )
    found["learning_rate"] = min(validation, key=validation.get)
    model = lora_fit(x, y)
    found["LoRA"] = scores(
        model.predict(x_test, verbose=0), model.predict(x_ood, verbose=0), y_test
    )
    model = lora_fit(x[:cut], y[:cut])
    head = model.get_layer("head")
    features = keras.Model(model.input, head.input)
    logit = lambda a: features.predict(a, verbose=0) @ head.kernel.numpy() + head.bias.numpy()  # noqa: E731
    temperature = fit_temperature(logit(x[cut:]), y[cut:])
    soft = lambda a: tf.nn.softmax(logit(a) / temperature).numpy()  # noqa: E731
    found["LoRA + temperature"] = scores(soft(x_test), soft(x_ood), y_test)
    model = lora_fit(x, y, dropout=0.2)
    mc = lambda a: np.mean([model(a, training=True).numpy() for _ in range(10)], axis=0)  # noqa: E731
    found["LoRA + MC dropout"] = scores(mc(x_test), mc(x_ood), y_test)
    for name, optimizer in BAYESIAN.items():
        keras.utils.set_random_seed(seed)
        model = bk.bayesianize(
            fine_tune_model(vit), num_particles=args.particles, lora_rank=args.rank, seed=seed
        )
        model.compile(optimizer=optimizer(found["learning_rate"]))
        model.fit(x, y, epochs=args.epochs, batch_size=64, verbose=0)
        found[name] = scores(
            model.predict(x_test, verbose=0), model.predict(x_ood, verbose=0), y_test
        )
    return found


def run_seeds(vit, data, args, start):
    """{variant: [scores per seed]} and the tuned Keras learning rate of each seed."""
    results, rates = {}, []
    for seed in args.seeds:
        found = run_seed(vit, data, seed, args)
        rates.append(found.pop("learning_rate"))
        for name, s in found.items():
            results.setdefault(name, []).append(s)
        print(
            f"seed {seed} done at {time.perf_counter() - start:.0f} s (Keras LoRA rate {rates[-1]:g})",
            flush=True,
        )
    return results, rates


def cost(vit, args, batch):
    """Fit step time and trainable bytes: one Keras LoRA, Bayesian LoRA (GPF, N particles), N Keras LoRA models."""
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(args.particles * batch, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 5, args.particles * batch)
    iterator = iter(tf.data.Dataset.from_tensors((x[:batch], y[:batch])).repeat())
    larger = iter(tf.data.Dataset.from_tensors((x, y)).repeat())

    def stepper(model):
        model.make_train_function()
        return model.train_function

    single = keras_lora(vit, args.rank)
    same_arithmetic = keras_lora(vit, args.rank)
    separate = [keras_lora(vit, args.rank) for _ in range(args.particles)]
    bayesian = bk.bayesianize(
        fine_tune_model(vit), num_particles=args.particles, lora_rank=args.rank, seed=0
    )
    bayesian.compile(optimizer=bk.optimizers.GaussianParticleFlow(), dataset_size=1000)
    steps = {
        "one LoRA": stepper(single),
        "Bayesian LoRA": stepper(bayesian),
        f"one LoRA on a {args.particles}x batch": stepper(same_arithmetic),
    }
    separate_steps = [stepper(m) for m in separate]
    fns = {
        "one LoRA": lambda: [steps["one LoRA"](iterator)["loss"]],
        "Bayesian LoRA": lambda: [steps["Bayesian LoRA"](iterator)["loss"]],
        f"one LoRA on a {args.particles}x batch": lambda: [
            steps[f"one LoRA on a {args.particles}x batch"](larger)["loss"]
        ],
        f"{args.particles} LoRA fine-tunes": lambda: [s(iterator)["loss"] for s in separate_steps],
    }
    times = harness.interleaved_microseconds(fns, args.rounds, args.steps, np.random.default_rng(0))
    nbytes = lambda model: sum(v.numpy().nbytes for v in model.trainable_variables)  # noqa: E731
    trainable = {
        "one LoRA": nbytes(single),
        "Bayesian LoRA": nbytes(bayesian),
        f"one LoRA on a {args.particles}x batch": nbytes(single),
        f"{args.particles} LoRA fine-tunes": args.particles * nbytes(single),
    }
    return [
        {
            "variant": name,
            "batch": batch,
            "ms_per_step": float(np.median(t)) / 1e3,
            "ratio_to_separate": harness.paired_ratio(
                times, name, f"{args.particles} LoRA fine-tunes"
            ),
            "trainable_bytes": trainable[name],
        }
        for name, t in times.items()
    ]


def table(results, rates, costs, args, machine, command, seconds):
    lines = [
        "# Bayesian LoRA on a vision transformer: pretrained on digits 0-4, fine-tuned on digits 5-9",
        "",
        f"`{command}`: bk.zoo.keras_vision_transformer (18k weights) pretrained {args.pretrain_epochs} epochs on "
        f"0-4; rank-{args.rank} LoRA on query / value of both blocks and a new head, {args.epochs} epochs, batch "
        f"64; {args.particles} particles; mean +- sd over seeds {args.seeds}. OOD AUROC: predictive entropy, "
        f"test digits 0-4. Machine: {machine['processor']}, {machine['cpu_count']} CPUs, oneDNN "
        f"{machine['onednn']}; the whole run {seconds / 60:.1f} min.",
        "",
        "| variant | accuracy | NLL | ECE | OOD AUROC |",
        "|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        cells = [
            f"{np.mean([r[m] for r in runs]):.3f} +- {np.std([r[m] for r in runs]):.3f}"
            for m in METRICS
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Keras' LoRA variants use the Adam learning rate with the best validation NLL among {args.keras_rates} "
        f"(chosen per seed: {rates}).",
        "",
        f"Fit step on one fixed batch (median of {args.rounds} interleaved rounds of {args.steps} steps; ratio "
        "paired within rounds):",
        "",
        "| batch | variant | ms / step | ratio to the separate fine-tunes | trainable bytes |",
        "|---|---|---|---|---|",
    ]
    for row in costs:
        lines.append(
            f"| {row['batch']} | {row['variant']} | {row['ms_per_step']:.1f} | {row['ratio_to_separate']:.2f} | "
            f"{row['trainable_bytes']:,} |"
        )
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--pretrain-epochs", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--particles", type=int, default=8)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--keras-rates",
        type=float,
        nargs="+",
        default=[1e-3, 3e-3, 1e-2],
        help="Adam learning rates tried for Keras' LoRA (the best validation NLL is used)",
    )
    parser.add_argument(
        "--cost-batches",
        type=int,
        nargs="+",
        default=[64, 512],
        help="batch sizes of the step-time comparison",
    )
    parser.add_argument("--out", default="lora_digits")
    args = parser.parse_args()
    start = time.perf_counter()
    pretrain, finetune, test, ood = split()
    vit = pretrained(pretrain, args.pretrain_epochs)
    print(f"pretrained in {time.perf_counter() - start:.0f} s", flush=True)
    results, rates = run_seeds(vit, (finetune, test, ood), args, start)
    costs = [row for batch in args.cost_batches for row in cost(vit, args, batch)]
    seconds = time.perf_counter() - start
    machine, command = harness.machine_info(), " ".join(["python"] + sys.argv)
    lines = table(results, rates, costs, args, machine, command, seconds)
    paths = harness.save_results(
        args.out,
        {
            "command": command,
            "args": vars(args),
            "machine": machine,
            "results": results,
            "keras_learning_rates": rates,
            "cost": costs,
            "seconds": seconds,
        },
        lines,
    )
    print("\n".join(lines))
    print("wrote", *paths)


if __name__ == "__main__":
    main()
