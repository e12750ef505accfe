"""Transfer learning: a MobileNetV2 trained here on digits 0-4 becomes a Bayesian network for digits 5-9.

No downloads: the "pretrained" backbone is trained in this script on scikit-learn's 8x8 digits 0-4, upsampled
to 32x32 (MobileNetV2's smallest input). Then, on digits 5-9, it is fine-tuned with a Keras head (with and
without temperature scaling, with MC dropout; in the frozen regime also with the last block unfrozen) and
converted by `bayesianize` with a Bayesian head (GPF, MGVBP, or a deep ensemble of heads) or a Bayesian last
block. `--regime frozen` keeps the backbone frozen; `--regime finetuned` trains it too (as one
shared point estimate under the head). Prints held-out accuracy / NLL / ECE on digits 5-9 and the OOD AUROC by
predictive entropy with digits 0-4 as out-of-distribution inputs (benchmarks/transfer_digits.py runs the
same over seeds).

    python examples/transfer_digits.py [--regime frozen|finetuned] [--optimizers GPF MGVBP] [--seed 0]
        [--variants keras keras_block mc_dropout ensemble bayesian]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402

SIZE = 32
LAST_BLOCK = (
    "block_16_expand",
    "block_16_expand_BN",
    "block_16_depthwise",
    "block_16_depthwise_BN",
    "block_16_project",
    "block_16_project_BN",
    "Conv_1",
    "Conv_1_bn",
    "head",
)
OPTIMIZERS = {
    "GPF": bk.optimizers.GaussianParticleFlow,
    "MGVBP": bk.optimizers.MGVBP,
    "ensemble": bk.optimizers.IndependentParticles,
}


def digits_split():
    """(pretraining 0-4, fine-tuning 5-9 train, 5-9 test, 0-4 test as OOD), images upsampled to 32x32."""
    (x, y), (x_test, y_test) = bk.datasets.load_digits()
    up = lambda a: tf.image.resize(a, (SIZE, SIZE)).numpy()  # noqa: E731
    x, x_test = up(x), up(x_test)
    old, new, old_test, new_test = y < 5, y >= 5, y_test < 5, y_test >= 5
    return (
        (x[old], y[old]),
        (x[new], y[new] - 5),
        (x_test[new_test], y_test[new_test] - 5),
        x_test[old_test],
    )


def pretrained_backbone(pretrain, epochs, alpha, seed=0):
    """A MobileNetV2 (weights=None) trained on digits 0-4 with a throw-away head and random shifts of up to 10%
    (without them, 20 epochs, the frozen backbone's Keras fine-tune reached 0.50 accuracy on digits 5-9; with
    them, 40 epochs, 0.71: benchmarks/results/transfer_digits.md); returns the backbone."""
    keras.utils.set_random_seed(seed)
    backbone = keras.applications.MobileNetV2(
        input_shape=(SIZE, SIZE, 1), alpha=alpha, include_top=False, weights=None, pooling="avg"
    )
    for layer in (
        backbone.layers
    ):  # MobileNetV2's 0.999 averages ~1000 steps: far more than this pretraining has
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.9
    classifier = keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 1)),
            keras.layers.RandomTranslation(0.1, 0.1, seed=seed),
            backbone,
            keras.layers.Dense(5, activation="softmax"),
        ]
    )
    classifier.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    classifier.fit(*pretrain, epochs=epochs, batch_size=64, verbose=0)
    return backbone


def transfer_model(backbone, regime, dropout=0.0, unfrozen=()):
    """The Keras model users start from: a copy of the pretrained backbone (frozen in the 'frozen' regime but for
    the layers named in `unfrozen`) and a new 5-class softmax head named 'head'."""
    copy = keras.models.clone_model(backbone)
    copy.set_weights(backbone.get_weights())
    copy.trainable = regime == "finetuned" or bool(unfrozen)
    if unfrozen and regime == "frozen":
        for layer in copy.layers:
            layer.trainable = layer.name in unfrozen
    inputs = keras.Input((SIZE, SIZE, 1))
    h = copy(inputs)
    if dropout:
        h = keras.layers.Dropout(dropout)(h)
    return keras.Model(inputs, keras.layers.Dense(5, activation="softmax", name="head")(h))


def entropy(probs):
    return -np.sum(probs * np.log(np.clip(probs, 1e-12, 1.0)), axis=1)


def scores(probs, probs_ood, y):
    s = bk.metrics.evaluate_probs(probs, y)
    s["ood_auroc"] = float(bk.metrics.auroc(entropy(probs), entropy(probs_ood)))
    return {k: float(v) for k, v in s.items()}


def fit_temperature(logits, y):
    """The temperature minimising the NLL of softmax(logits / T) on held-out data (a 1-D search)."""
    grid = np.exp(np.linspace(np.log(0.05), np.log(20.0), 400))
    nlls = [bk.metrics.nll(tf.nn.softmax(logits / t).numpy(), y) for t in grid]
    return float(grid[int(np.argmin(nlls))])


def run_keras(
    backbone,
    data,
    regime,
    epochs,
    seed,
    dropout=0.0,
    mc_samples=0,
    unfrozen=(),
    name="Keras fine-tune",
):
    """The deterministic fine-tune trained on all the fine-tuning data, and with temperature scaling (trained on
    the first 80%, the temperature fitted on the last 20%); MC dropout's scores instead when `mc_samples`."""
    (x, y), (x_test, y_test), x_ood = data

    def fitted(x, y):
        keras.utils.set_random_seed(seed)
        model = transfer_model(backbone, regime, dropout, unfrozen)
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
        return model

    model = fitted(x, y)
    if mc_samples:
        mc = lambda a: np.mean([model(a, training=True).numpy() for _ in range(mc_samples)], axis=0)  # noqa: E731
        return {"MC dropout": scores(mc(x_test), mc(x_ood), y_test)}
    results = {
        name: scores(model.predict(x_test, verbose=0), model.predict(x_ood, verbose=0), y_test)
    }
    cut = int(0.8 * len(x))
    model = fitted(x[:cut], y[:cut])
    head = model.get_layer(
        "head"
    )  # softmax(features @ kernel + bias): its logits for temperature scaling
    features = keras.Model(model.input, head.input)
    logit = lambda a: features.predict(a, verbose=0) @ head.kernel.numpy() + head.bias.numpy()  # noqa: E731
    temperature = fit_temperature(logit(x[cut:]), y[cut:])
    soft = lambda a: tf.nn.softmax(logit(a) / temperature).numpy()  # noqa: E731
    results[f"{name} + temperature"] = {
        **scores(soft(x_test), soft(x_ood), y_test),
        "temperature": temperature,
    }
    return results


def run_bayesian(backbone, data, regime, part, optimizer, epochs, particles, seed):
    """bayesianize's Bayesian head ('head') or last block ('block') with `optimizer`'s defaults."""
    (x, y), (x_test, y_test), x_ood = data
    keras.utils.set_random_seed(seed)
    bayesian = ["head"] if part == "head" else list(LAST_BLOCK)
    model = bk.bayesianize(
        transfer_model(backbone, regime), num_particles=particles, bayesian=bayesian, seed=seed
    )
    model.compile(optimizer=OPTIMIZERS[optimizer]())
    model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
    return scores(model.predict(x_test, verbose=0), model.predict(x_ood, verbose=0), y_test)


VARIANTS = ("keras", "keras_block", "mc_dropout", "ensemble", "bayesian")


def run_variants(
    backbone,
    data,
    regime,
    epochs,
    seed,
    particles,
    parts=("head", "block"),
    optimizers=("GPF", "MGVBP"),
    variants=VARIANTS,
):
    """Every variant of the comparison on one seed: {row name: scores}."""
    found = {}
    if "keras" in variants:
        found.update(run_keras(backbone, data, regime, epochs, seed))
    if (
        "keras_block" in variants and regime == "frozen" and "block" in parts
    ):  # the deterministic fine-tune of
        found.update(
            run_keras(
                backbone,
                data,
                regime,
                epochs,
                seed,
                unfrozen=LAST_BLOCK,  # the same layers
                name="Keras fine-tune, last block",
            )
        )
    if "mc_dropout" in variants:
        found.update(run_keras(backbone, data, regime, epochs, seed, dropout=0.2, mc_samples=10))
    if "ensemble" in variants:
        found[f"ensemble of heads ({particles})"] = run_bayesian(
            backbone, data, regime, "head", "ensemble", epochs, particles, seed
        )
    for part in parts if "bayesian" in variants else ():
        for name in optimizers:
            found[f"Bayesian {part}, {name} ({particles})"] = run_bayesian(
                backbone, data, regime, part, name, epochs, particles, seed
            )
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", choices=("frozen", "finetuned"), default="frozen")
    parser.add_argument(
        "--optimizers", nargs="+", default=["GPF", "MGVBP"], choices=("GPF", "MGVBP")
    )
    parser.add_argument("--parts", nargs="+", default=["head", "block"], choices=("head", "block"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--pretrain-epochs", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--particles", type=int, default=10)
    parser.add_argument("--alpha", type=float, default=0.35, help="MobileNetV2's width multiplier")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pretrain, finetune, test, ood = digits_split()
    backbone = pretrained_backbone(pretrain, args.pretrain_epochs, args.alpha)
    results = run_variants(
        backbone,
        (finetune, test, ood),
        args.regime,
        args.epochs,
        args.seed,
        args.particles,
        args.parts,
        args.optimizers,
        args.variants,
    )
    print(f"digits 5-9 after pretraining on 0-4, backbone {args.regime}:")
    for name, s in results.items():
        print(
            f"{name:<45} accuracy {s['accuracy']:.3f}  NLL {s['nll']:.3f}  ECE {s['ece']:.3f}  "
            f"OOD AUROC {s['ood_auroc']:.3f}"
        )


if __name__ == "__main__":
    main()
