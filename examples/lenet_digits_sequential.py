"""Sequential Bayesian updates of a LeNet's output layer with PFBR (Chen, Dai & Song 2019), digits 8 vs 6.

A Keras LeNet-5 with an 8-unit bottleneck is trained on the OTHER eight digit classes and frozen as a
feature extractor; a BayesianModel puts a particle logistic head (256 particles, 8 weights + bias) on its
features for the new task "8 or 6?". A ParticleFlowBayesRule operator is meta-trained on rotated versions
of the task (bayes_keras.pfbr.OutputLayerFilter.meta_training_problem); then the head starts from its prior
and the labelled 8s and 6s arrive in batches of 8: each batch moves the particles to the next posterior
with one pass of the operator (no re-optimisation, no stored data). Prints held-out accuracy after each
of the first batches, against one-pass SMC with the same particles.

    python examples/lenet_digits_sequential.py
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from bayes_keras import pfbr  # noqa: E402
import bayes_keras as bk  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20, help="epochs of the feature extractor")
    parser.add_argument(
        "--iterations", type=int, default=100, help="meta-training iterations of the operator"
    )
    parser.add_argument(
        "--batches", type=int, default=10, help="labelled batches streamed to the head"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.batches < 1 or args.epochs < 1:
        parser.error("--batches and --epochs must be at least 1")
    (x, y), (x_test, y_test) = bk.datasets.load_digits()
    keras.utils.set_random_seed(args.seed)
    other = ~np.isin(y, (6, 8))
    body = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(6, 5, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(16, 5, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(8, activation="tanh", name="features"),
        ]
    )
    classifier = keras.Sequential([body, keras.layers.Dense(10)])
    classifier.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    classifier.fit(x[other], y[other], epochs=args.epochs, batch_size=64, verbose=0)
    body.trainable = False

    task, task_test = np.isin(y, (6, 8)), np.isin(y_test, (6, 8))
    x_task, y_task = x[task], (y[task] == 8).astype(np.float32)
    x_eval, y_eval = x_test[task_test], (y_test[task_test] == 8).astype(np.float32)
    inputs = keras.Input((8, 8, 1))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(1, num_particles=256)(body(inputs)), likelihood="bernoulli"
    )
    head = pfbr.OutputLayerFilter(model)
    operator = pfbr.ParticleFlowBayesRule(latent_dim=head.latent_dim)
    operator.meta_fit(
        head.meta_training_problem(x_task, y_task, batch_size=8),
        iterations=args.iterations,
        tasks_per_iteration=4,
        num_particles=64,
        sequence_length=10,
        seed=args.seed,
        verbose=0,
    )

    order = np.random.default_rng(args.seed).permutation(len(x_task))
    stream = [order[i * 8 : (i + 1) * 8] for i in range(args.batches)]
    head.reset(seed=args.seed)
    accuracy = {"PFBR": [], "SMC": []}
    for batch in stream:
        head.update(operator, x_task[batch], y_task[batch])
        accuracy["PFBR"].append(
            float(np.mean((model.predict(x_eval, verbose=0).reshape(-1) > 0.5) == y_eval))
        )
    # one-pass SMC with the same particles on the same stream, through the same problem interface
    features = head.features(x_task)
    problem = pfbr.LogisticRegressionProblem(features, y_task, batch_size=8, max_angle=0.0)
    observations = np.stack([np.concatenate([features[b], y_task[b, None]], 1) for b in stream])[
        None
    ]
    task_tensors = {"angle": np.zeros(1, np.float32)}  # the unrotated task
    smc = pfbr.SequentialMonteCarlo().filter(
        problem, task_tensors, observations, num_particles=256, seed=args.seed
    )
    for particles in smc[:, 0]:
        head.set_particles(particles)
        accuracy["SMC"].append(
            float(np.mean((model.predict(x_eval, verbose=0).reshape(-1) > 0.5) == y_eval))
        )
    print(
        f"digits 8 vs 6 on frozen LeNet features, {len(x_eval)} held-out images, batches of 8, 256 particles"
    )
    print("held-out accuracy after each batch:")
    for name, values in accuracy.items():
        print(f"  {name:<5}", " ".join(f"{v:.3f}" for v in values))


if __name__ == "__main__":
    main()
