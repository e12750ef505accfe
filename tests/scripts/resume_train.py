"""Trains a small Bayesian network for 3 epochs with bayes_keras.callbacks.BackupAndRestore(save_freq=1),
printing one line per trained batch; when fit completes, writes the final weights to OUT (.npz). Killed and
run again, it resumes from the backup.

    python tests/scripts/resume_train.py METHOD BACKUP_DIR OUT [validation [kill]]

With "validation": compiled with metrics=["accuracy"], fit with validation_split=0.25; with "kill" the process
kills itself during the first epoch's validation (after that epoch's last checkpoint).
"""

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402

METHOD, BACKUP_DIR, OUT = sys.argv[1:4]
VALIDATION, KILL = "validation" in sys.argv[4:], "kill" in sys.argv[4:]
OPTIMIZERS = {
    "gpf": lambda: bk.optimizers.GaussianParticleFlow(),
    "mgvbp": lambda: bk.optimizers.MGVBP(structure="diagonal"),
}


class _Progress(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print("batch", flush=True)

    def on_test_batch_end(self, batch, logs=None):
        if KILL:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(192, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32") + (x[:, 2] > 1).astype("int32")
    inputs = keras.Input((8,))
    hidden = bk.layers.Dense(16, activation="relu", num_particles=4)(inputs)
    hidden = bk.layers.Dropout(0.2)(hidden)
    model = bk.BayesianModel(inputs, bk.layers.Dense(3)(hidden), likelihood="categorical")
    model.compile(optimizer=OPTIMIZERS[METHOD](), metrics=["accuracy"] if VALIDATION else None)
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=3,
        verbose=0,
        shuffle=True,
        validation_split=0.25 if VALIDATION else 0.0,
        callbacks=[bk.callbacks.BackupAndRestore(BACKUP_DIR, save_freq=1), _Progress()],
    )
    temporary = OUT + ".partial.npz"
    np.savez(temporary, *[v.numpy() for v in model.weights + model.optimizer.variables])
    os.replace(temporary, OUT)
    print("done", flush=True)


if __name__ == "__main__":
    main()
