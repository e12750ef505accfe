"""Local refinement (Havasi et al. 2021) of a mean-field LeNet-5 posterior on digits.

The base posterior is examples/lenet_digits_vi.py's MeanFieldVI (T = 0.1, 20 epochs, 10 samples); then
`bayes_keras.refine` refines its 10 samples with K = 5 auxiliary variables, 200 Adam steps per stage
(the paper's), side by side in the particle slots. Prints held-out accuracy / NLL / ECE before and after
and the auxiliary lower bound ELBO_aux after each stage.

    python examples/lenet_digits_refinement.py
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import bayes_keras as bk  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--stages", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="Adam steps per refinement stage")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    (x, y), (x_test, y_test) = bk.datasets.load_digits()
    keras.utils.set_random_seed(args.seed)
    model = bk.zoo.lenet5(num_particles=10)
    model.compile(
        optimizer=bk.optimizers.MeanFieldVI(1e-2, initial_std=3e-2, seed=args.seed), temperature=0.1
    )
    model.fit(x, y, epochs=args.epochs, batch_size=64, verbose=0)
    scores = {"mean-field VI": bk.metrics.evaluate_probs(model.predict(x_test, verbose=0), y_test)}
    history = bk.refine(
        model, x, y, num_stages=args.stages, steps_per_stage=args.steps, seed=args.seed, verbose=0
    )
    scores["refined"] = bk.metrics.evaluate_probs(model.predict(x_test, verbose=0), y_test)
    for name, s in scores.items():
        print(f"{name:<14} accuracy {s['accuracy']:.3f}  NLL {s['nll']:.3f}  ECE {s['ece']:.3f}")
    print(
        "ELBO_aux per example after each stage (stage 0: the base ELBO):",
        np.round(history.history["elbo_aux"], 2).tolist(),
    )


if __name__ == "__main__":
    main()
