"""A skipped update costs one step: `iterations` counts committed updates, and a learning-rate schedule
is read at every attempted step (committed + skipped), so one non-finite rate does not stop training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from test_contract import OPTIMIZERS, _data, _functional


class NaNAt(keras.optimizers.schedules.LearningRateSchedule):
    """A constant rate, NaN at one step."""

    def __init__(self, rate, bad_step):
        self.rate, self.bad_step = rate, bad_step

    def __call__(self, step):
        rate = tf.constant(self.rate, tf.float32)
        return tf.where(
            tf.equal(tf.cast(step, tf.int64), self.bad_step), tf.constant(np.nan, tf.float32), rate
        )

    def get_config(self):
        return {"rate": self.rate, "bad_step": self.bad_step}


def _train(name, schedule):
    x, y = _data()
    keras.utils.set_random_seed(5)
    optimizer = OPTIMIZERS[name]()
    rate = float(optimizer.learning_rate.numpy())
    optimizer = type(optimizer).from_config(
        {**optimizer.get_config(), "learning_rate": schedule(rate)}
    )
    model = _functional()
    model.compile(optimizer=optimizer, dataset_size=len(x))
    history = model.fit(x, y, epochs=8, batch_size=16, verbose=0, shuffle=False)
    return model, history.history["nll"][-1]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_nan_rate_costs_exactly_one_step(name):
    steps = 8 * 3
    clean, clean_nll = _train(name, lambda rate: NaNAt(rate, -1))
    with pytest.warns(RuntimeWarning, match="update\\(s\\) skipped"):
        faulty, faulty_nll = _train(name, lambda rate: NaNAt(rate, 4))
    assert int(faulty.optimizer.skipped_updates.numpy()) == 1 and faulty.skipped_steps == 0
    assert int(faulty.optimizer.iterations.numpy()) == steps - 1
    assert int(clean.optimizer.iterations.numpy()) == steps
    assert all(np.isfinite(v.numpy()).all() for v in faulty.weights)
    if name == "mgvbp_score":
        return  # its defaults diverge on this problem with or without a fault (NLL 4.6-5.9): no range to meet
    # Training went on: the held-in predictive NLL is where the unfaulted run's is.
    assert abs(faulty_nll - clean_nll) < 0.1 * clean_nll + 0.02, (faulty_nll, clean_nll)
