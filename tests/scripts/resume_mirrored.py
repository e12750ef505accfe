"""GPF under MirroredStrategy (2 logical CPUs) with bayes_keras.callbacks.BackupAndRestore(save_freq=1); with STOP
the process exits (as if killed) right after that training step. Prints the final weights' sums as JSON.

    python tests/scripts/resume_mirrored.py BACKUP_DIR [STOP]
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import bayes_keras as bk  # noqa: E402

STOP = int(sys.argv[2]) if len(sys.argv) > 2 else 0


class _Stop(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if STOP and int(self.model.optimizer.iterations.numpy()) == STOP:
            os._exit(9)


def main():
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(128, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        inputs = keras.Input((8,))
        hidden = bk.layers.Dense(8, activation="relu", num_particles=4)(inputs)
        model = bk.BayesianModel(inputs, bk.layers.Dense(2)(hidden), likelihood="categorical")
        model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[bk.callbacks.BackupAndRestore(sys.argv[1], save_freq=1), _Stop()],
    )
    print(json.dumps([v.numpy().tolist() for v in model.weights]))


if __name__ == "__main__":
    main()
