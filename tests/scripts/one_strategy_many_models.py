"""Three models with three methods, in turn, under ONE MirroredStrategy (2 logical CPUs) in one process: GPF, MGVBP
with the empirical Fisher, MatrixSVGD. Prints one JSON line: method -> final loss (finite when it trained).

    python tests/scripts/one_strategy_many_models.py
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import bayes_keras as bk  # noqa: E402


def main():
    x = np.random.default_rng(0).normal(size=(64, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    losses = {}
    for optimizer in (bk.optimizers.GaussianParticleFlow(),
                      bk.optimizers.MGVBP(structure="diagonal", curvature="empirical_fisher"),
                      bk.optimizers.MatrixSVGD()):
        with strategy.scope():
            inputs = keras.Input((6,))
            hidden = bk.layers.Dense(8, activation="relu", num_particles=4)(inputs)
            model = bk.BayesianModel(inputs, bk.layers.Dense(2)(hidden), likelihood="categorical")
            model.compile(optimizer=optimizer)
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        losses[type(optimizer).__name__] = float(history.history["loss"][-1])
    print(json.dumps(losses), flush=True)


if __name__ == "__main__":
    main()
