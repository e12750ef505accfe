"""Saves (or exports) a tiny model over the same path again and again, each time with all particle weights
set to the version number, until it is killed; writes READY once the first version is in place.

    python tests/scripts/save_loop.py save|export TARGET READY
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import bayes_keras as bk  # noqa: E402

MODE, TARGET, READY = sys.argv[1:4]


def main():
    inputs = keras.Input((4,))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(3, num_particles=2)(inputs), likelihood="categorical"
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    version = 0
    while True:
        version += 1
        model.set_weights(
            [np.full(w.shape, version, w.dtype) if w.ndim else w for w in model.get_weights()]
        )
        if MODE == "save":
            model.save(TARGET)
        else:
            model.export(TARGET, verbose=False)
        if version == 1:
            with open(READY, "w") as f:
                f.write("1")


if __name__ == "__main__":
    main()
