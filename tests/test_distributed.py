"""Training under tf.distribute equals training on one device (docs/distributed.md).

Every optimizer trains a model with a synchronized particle BatchNormalization, or an LSTM with input
and recurrent dropout and a synchronized BatchNormalization, for 2 epochs of 3 global batches, with
fit and with the documented custom loop (bayesian_gradients + apply under strategy.run), on one device
and under a MirroredStrategy over 2 logical CPU devices. The CPU is split before TensorFlow starts, so
the runs happen in one subprocess (tests/scripts/distributed_check.py), whose results the tests read.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "distributed_check.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
from distributed_check import RUNS  # noqa: E402

# Relative to 1 + the largest magnitude of each variable: rounding of sums taken in another order
# (per replica, then across replicas), through a few steps of training.
TOLERANCE = 2e-6


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {(r["name"], r["loop"]): r for r in lines}


@pytest.mark.parametrize("loop", ["fit", "custom"])
@pytest.mark.parametrize("name", sorted(RUNS))
def test_two_replicas_equal_one_device(results, name, loop):
    if name == "keras_adam" and loop == "custom":
        pytest.skip("a plain Keras optimizer's custom loop is Keras' own")
    r = results[(name, loop)]
    assert r["moved"] > 1e-3, r  # training moved the weights: the comparison is not vacuous
    assert r["in_sync"], r  # every variable mirrored, its copies identical
    assert r["state"] < TOLERANCE, r  # every model and optimizer variable
    assert r["history"] < TOLERANCE and r["history_keys"], r  # loss, nll, compiled / particle / bound metrics
    assert r["evaluate"] < TOLERANCE and r["predict"] < TOLERANCE, r
