"""Several models, methods and strategy objects in ONE process (as in a notebook), each compared with the
same model trained on one device in that process: GPF, MGVBP with the empirical Fisher and MatrixSVGD
with KFAC, (1) each under a NEW MirroredStrategy over 2 logical CPUs, (2) the same in the reverse order,
(3) all three under one shared strategy; then (4) the models of (1), each trained one more epoch under
its own strategy and evaluated. Prints one JSON line: "run/method" -> the largest difference
from the one-device run, relative to 1 + the largest magnitude of each variable (weights and optimizer
state) and of the loss history; "moved_by_training/method": how far training moved the weights.

    python tests/scripts/many_strategies_check.py
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

import numpy as np  # noqa: E402

import bayes_keras as bk  # noqa: E402
from strategy_mlp import compiled_mlp, data  # noqa: E402

METHODS = {
    "gpf": lambda: bk.optimizers.GaussianParticleFlow(1e-2),
    "mgvbp_fisher": lambda: bk.optimizers.MGVBP(
        1e-2, structure="diagonal", curvature="empirical_fisher", seed=5
    ),
    "matrix_svgd": lambda: bk.optimizers.MatrixSVGD(0.05),  # KFAC-preconditioned (its default)
}


def state(model, history):
    return [
        np.array(v.numpy(), np.float64) for v in model.variables + model.optimizer.variables
    ] + [np.array(history["loss"], np.float64)]


def train(name, strategy):
    """(the final state, how far training moved the weights, the model)"""
    x, y = data()
    model = compiled_mlp(strategy, METHODS[name], num_particles=4)
    initial = [np.array(v.numpy(), np.float64) for v in model.variables]
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    final = state(model, history)
    return final, difference(initial, final[: len(initial)]), model


def train_on(model):
    """One more epoch of a trained model, then its state and its evaluate."""
    x, y = data()
    history = model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0).history
    return state(model, history) + [np.array(model.evaluate(x, y, verbose=0), np.float64)]


def difference(a, b):
    assert len(a) == len(b)
    return max(
        float(np.max(np.abs(u - v), initial=0.0) / (1 + np.max(np.abs(u), initial=0.0)))
        for u, v in zip(a, b)
    )


def main():
    one_device, first_models, found = {}, {}, {}
    for name in METHODS:
        one_device[name], found[f"moved_by_training/{name}"], first_models[f"one_device/{name}"] = (
            train(name, tf.distribute.get_strategy())
        )
    mirrored = lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])  # noqa: E731
    for name in METHODS:
        final, _, first_models[name] = train(name, mirrored())
        found[f"new_strategy_each/{name}"] = difference(one_device[name], final)
    for name in reversed(METHODS):
        found[f"new_strategy_each_reversed/{name}"] = difference(
            one_device[name], train(name, mirrored())[0]
        )
    shared = mirrored()
    for name in METHODS:
        found[f"one_strategy/{name}"] = difference(one_device[name], train(name, shared)[0])
    for name in METHODS:  # back to the first models, under their strategies, after the others
        found[f"trained_again_after_the_others/{name}"] = difference(
            train_on(first_models[f"one_device/{name}"]), train_on(first_models[name])
        )
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    main()
