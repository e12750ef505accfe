"""Convert a trained Keras CNN into a Bayesian one with bayes_keras.bayesianize, and refine it with GPF.

A plain Keras CNN (Conv2D, MaxPooling2D, Conv2D, Flatten, Dense, Dense) is trained on the 8x8 digits;
`bayesianize` turns it into a BayesianModel with 10 particles placed around its trained weights (same
parameter count per particle), which starts at the network's accuracy; a few epochs of Gaussian particle
flow then give a posterior predictive. Prints accuracy / NLL / ECE of the network, of the converted model
before training, and after.

    python examples/convert_keras_model.py
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import bayes_keras as bk  # noqa: E402


def keras_cnn():
    """The plain Keras CNN this example converts (benchmarks/conversion.py measures the same one)."""
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="epochs of the Keras CNN")
    parser.add_argument("--bayesian-epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    (x, y), (x_test, y_test) = bk.datasets.load_digits()
    keras.utils.set_random_seed(args.seed)
    cnn = keras_cnn()
    cnn.compile("adam", "sparse_categorical_crossentropy")
    cnn.fit(x, y, epochs=args.epochs, batch_size=64, verbose=0)

    def scores(probs):
        s = bk.metrics.evaluate_probs(probs, y_test)
        return f"accuracy {s['accuracy']:.4f}  NLL {s['nll']:.4f}  ECE {s['ece']:.4f}"

    print(f"Keras CNN ({cnn.count_params()} weights):   {scores(cnn.predict(x_test, verbose=0))}")
    model = bk.bayesianize(cnn, num_particles=10, seed=args.seed)  # softmax -> categorical
    mi = model.uncertainty(x_test)["mutual_information"].mean()
    print(
        f"bayesianized, before training:   {scores(model.predict(x_test, verbose=0))}  mutual information {mi:.4f}"
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-3, structure="layer"))
    model.fit(x, y, epochs=args.bayesian_epochs, batch_size=64, verbose=0)
    print(
        f"after {args.bayesian_epochs} epochs of GPF:        {scores(model.predict(x_test, verbose=0))}"
    )


if __name__ == "__main__":
    main()
