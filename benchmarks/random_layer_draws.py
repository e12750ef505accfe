"""What drawing random layers for the global batch costs under tf.distribute (issue: scale-out that holds).

Under a strategy, bayes_keras' random layers draw for the global batch and every particle and keep the replica's
part (docs/distributed.md, "Random layers"): each replica draws R times the noise it uses. This times a training
step of a convolutional model with dropout on image activations (32x32x3 inputs, two particle Conv2D(16, 3) layers
of 8 particles, each followed by Dropout(0.3), a Dense head; GPF; global batch 64) under a MirroredStrategy over 2
logical CPU devices, side by side in one process: the shipped layers, and the same model whose layers draw for
their own part only (what Keras' Dropout does: the cost floor, but each replica's rows b and b + B/2 share masks).
Median of 15 rounds of one epoch (8 steps) each, alternating, after warm-up.

Usage:
    python benchmarks/random_layer_draws.py
Writes benchmarks/results/random_layer_draws.{json,md}.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import bayes_keras as bk  # noqa: E402
from bayes_keras.training import distribute  # noqa: E402

import harness  # noqa: E402

ROUNDS = 15


def _model(strategy):
    with strategy.scope():
        inputs = keras.Input((32, 32, 3))
        h = bk.layers.Conv2D(16, 3, padding="same", activation="relu", num_particles=8)(inputs)
        h = bk.layers.Dropout(0.3)(h)
        h = bk.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
        h = bk.layers.Dropout(0.3)(h)
        h = bk.layers.GlobalAveragePooling2D()(h)
        model = bk.BayesianModel(inputs, bk.layers.Dense(10)(h), likelihood="categorical")
        model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    return model


def main():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(512, 32, 32, 3)).astype("float32"), rng.integers(0, 10, 512)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    fit = dict(batch_size=64, epochs=1, verbose=0, shuffle=False)
    shipped = _model(strategy)
    shipped.fit(x, y, **fit)  # traced with global draws
    own_part = _model(strategy)
    drawn_globally = distribute.distributed
    distribute.distributed = lambda: False  # traced with each replica drawing for its own part
    try:
        own_part.fit(x, y, **fit)
    finally:
        distribute.distributed = drawn_globally
    times = {"global batch (shipped)": [], "own part only": []}
    for _ in range(ROUNDS):
        for label, model in (("global batch (shipped)", shipped), ("own part only", own_part)):
            start = time.perf_counter()
            model.fit(x, y, **fit)
            times[label].append(time.perf_counter() - start)
    median = {k: float(np.median(v)) for k, v in times.items()}
    ratio = median["global batch (shipped)"] / median["own part only"]
    lines = [
        "# Global-batch draws of random layers under 2 replicas (benchmarks/random_layer_draws.py)",
        "",
        "Epoch of 8 training steps (global batch 64, 32x32x3 images, 2 particle convolutions of 8 particles with "
        f"Dropout(0.3) after each), MirroredStrategy over 2 logical CPU devices; median of {ROUNDS} alternating "
        "rounds.",
        "",
        "| draws | epoch (s) | per step (ms) |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v:.3f} | {1e3 * v / 8:.1f} |" for k, v in median.items()]
    lines += ["", f"Ratio: {ratio:.3f}."]
    harness.save_results(
        "random_layer_draws",
        {"median_s": median, "times_s": times, "ratio": ratio, "machine": harness.machine_info()},
        lines,
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
