"""A text-style GRU classifier: Embedding -> GRU -> Dense over token sequences, GPF against a Keras GRU.

The offline digits as "sentences" (bayes_keras.datasets.load_digit_tokens: each image row is a word, its
8 binarised pixels a token id among 256 row shapes; id 0 is padding, masked by the Embedding). The
Bayesian model is `bayes_keras.zoo.text_rnn` (particle Embedding and GRU, variational RNN dropout) trained
with Gaussian particle flow; the baseline the same network from plain Keras layers trained with Adam.
Prints held-out accuracy / NLL / ECE of both.

    python examples/text_gru.py
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--particles", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    (x, y), (x_test, y_test) = bk.datasets.load_digit_tokens()

    keras.utils.set_random_seed(args.seed)
    baseline = bk.zoo.keras_text_rnn(bk.datasets.DIGIT_TOKENS, 10, cell="gru", dropout=0.1)
    baseline.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    baseline.fit(x, y, epochs=args.epochs, batch_size=64, verbose=0)
    scores = {
        "Keras GRU (Adam)": bk.metrics.evaluate_probs(
            tf.nn.softmax(baseline.predict(x_test, verbose=0)).numpy(), y_test
        )
    }

    keras.utils.set_random_seed(args.seed)
    model = bk.zoo.text_rnn(
        bk.datasets.DIGIT_TOKENS, 10, cell="gru", num_particles=args.particles, dropout=0.1
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(3e-3, structure="layer"))
    model.fit(x, y, epochs=args.epochs, batch_size=64, verbose=0)
    scores[f"Bayesian GRU (GPF, {args.particles} particles)"] = bk.metrics.evaluate_probs(
        model.predict(x_test, verbose=0), y_test
    )

    print(
        f"digits as row-shape tokens, {len(x)} train / {len(x_test)} test sequences, {args.epochs} epochs"
    )
    print(f"{'model':<34} {'accuracy':>8} {'NLL':>7} {'ECE':>7}")
    for name, s in scores.items():
        print(f"{name:<34} {s['accuracy']:8.3f} {s['nll']:7.3f} {s['ece']:7.3f}")


if __name__ == "__main__":
    main()
