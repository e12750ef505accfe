"""Trains GPF, MGVBP (full, and diagonal with the empirical Fisher) and MatrixSVGD (KFAC) in turn with fit,
either in one process or as one worker of a MultiWorkerMirroredStrategy
on localhost, and saves the final weights and optimizer state to an .npz file.

    python tests/scripts/multi_worker_check.py single OUT.npz
    python tests/scripts/multi_worker_check.py worker INDEX PORT0,PORT1 OUT.npz

TF_CONFIG is set here, before TensorFlow starts (a MultiWorkerMirroredStrategy must be created first).
"""

import json
import os
import sys

MODE = sys.argv[1]
if MODE == "worker":
    index, ports = int(sys.argv[2]), sys.argv[3].split(",")
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": index},
        }
    )

import tensorflow as tf  # noqa: E402

STRATEGY = (
    tf.distribute.MultiWorkerMirroredStrategy()
    if MODE == "worker"
    else tf.distribute.get_strategy()
)

import keras  # noqa: E402

keras.config.disable_traceback_filtering()
tf.debugging.disable_traceback_filtering()
import numpy as np  # noqa: E402

import bayes_keras as bk  # noqa: E402
from strategy_mlp import compiled_mlp, data  # noqa: E402

OPTIMIZERS = {
    "gpf": lambda: bk.optimizers.GaussianParticleFlow(1e-2),
    "mgvbp": lambda: bk.optimizers.MGVBP(1e-2, seed=5),
    "mgvbp_fisher": lambda: bk.optimizers.MGVBP(
        1e-2, structure="diagonal", curvature="empirical_fisher", seed=5
    ),
    "matrix_svgd": lambda: bk.optimizers.MatrixSVGD(1e-2),
}


def train(name):
    x, y = data()
    model = compiled_mlp(STRATEGY, OPTIMIZERS[name], num_particles=3, metrics=["accuracy"])
    history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0).history
    state = {
        f"{name}/{i}": np.array(v.numpy())
        for i, v in enumerate(model.variables + model.optimizer.variables)
    }
    state[f"{name}/loss"] = np.array(history["loss"])
    state[f"{name}/iterations"] = np.array(int(model.optimizer.iterations.numpy()))
    return state


if __name__ == "__main__":
    out = sys.argv[-1]
    state = {}
    for name in OPTIMIZERS:
        state.update(train(name))
    np.savez(out, **state)
