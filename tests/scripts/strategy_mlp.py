"""What the strategy scripts (many_strategies_check.py, multi_worker_check.py) train: the same data and
MLP, so that their runs compare like with like. Import it after the strategy is created."""

import keras
import numpy as np

import bayes_keras as bk


def data():
    x = np.random.default_rng(0).normal(size=(64, 6)).astype("float32")
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32") + (x[:, 2] > 1.0).astype("int32")


def compiled_mlp(strategy, make_optimizer, num_particles, **compile_kwargs):
    """A 6-8-3 particle MLP compiled under `strategy` with `make_optimizer()` (created in its scope, like
    the model), its weights seeded (7)."""
    with strategy.scope():
        keras.utils.set_random_seed(7)
        model = bk.zoo.mlp(6, 3, hidden=(8,), num_particles=num_particles)
        model.compile(optimizer=make_optimizer(), likelihood="categorical", **compile_kwargs)
    return model
