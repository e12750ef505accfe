"""Training under tf.distribute equals training on one device (docs/distributed.md).

Every optimizer trains a model with a synchronized particle BatchNormalization, or an LSTM with input
and recurrent dropout and a synchronized BatchNormalization (GPF also a Bayesian-LoRA transformer converted by
bayesianize), for 2 epochs of 3 global batches, with
fit and with the documented custom loop (bayesian_gradients + apply under strategy.run), on one device
and under a MirroredStrategy over 2 logical CPU devices. The CPU is split before TensorFlow starts, so
the runs happen in one subprocess (tests/scripts/distributed_check.py), whose results the tests read.
Two workers of a MultiWorkerMirroredStrategy on localhost are checked the same way (multi_worker_check.py).
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from paths import SCRIPTS

SCRIPT = os.path.join(SCRIPTS, "distributed_check.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
from distributed_check import RUNS  # noqa: E402

# Relative to 1 + the largest magnitude of each variable: rounding of sums taken in another order
# (per replica, then across replicas), through a few steps of training.
TOLERANCE = 2e-6
# float16 compute: each step's values are rounded to 11 bits (5e-4), so the runs agree to float16 steps.
FLOAT16_TOLERANCE = {"state": 3e-2, "history": 1e-3, "evaluate": 1e-3, "predict": 1e-2}


# The custom loop (bayesian_gradients + apply under strategy.run) of these runs in the default suite (one
# particle optimizer, particle parallelism, one explicit-Gaussian optimizer with captured curvature); of
# every run with -m slow (the same code path as fit's step, which every run checks). MatrixSVGD with KFAC
# (38 s) and MeanFieldVI left the default suite to keep it within its time budget.
CUSTOM_LOOP_RUNS = ("gpf", "gpf_particle_parallel", "mgvbp_diagonal_fisher")
# fit under 2 replicas in the default suite: every optimizer family, both models, every likelihood kind but the
# normal one, particle parallelism and float16; the other runs (the same code paths with another structure,
# preconditioner or model) with -m slow, to keep the default suite within its time budget.
SLOW_FIT_RUNS = (
    "svgd",
    "matrix_svgd_kfac_sequence",
    "preconditioned_particles",
    "mgvbp_full",
    "mgvbp_layer",
    "mgvbp_kronecker_empirical_fisher",
    "mean_field_vi",
    "independent_converted_random_particle_parallel",
    "mgvbp_converted_random_particle_parallel",
)
FIT_RUNS = tuple(name for name in sorted(RUNS) if name not in SLOW_FIT_RUNS)


def _run(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=1500, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {(r["name"], r["loop"]): r for r in lines}


@pytest.fixture(scope="module")
def fit_results():
    return _run("--loop=fit", *FIT_RUNS)


@pytest.fixture(scope="module")
def custom_loop_results():
    return _run("--loop=custom", *CUSTOM_LOOP_RUNS)


def _check(r):
    tolerance = dict.fromkeys(("state", "history", "evaluate", "predict"), TOLERANCE)
    if r["policy"] == "mixed_float16":
        tolerance = FLOAT16_TOLERANCE
    assert r["moved"] > 1e-3, r  # training moved the weights: the comparison is not vacuous
    assert r["in_sync"], r  # every variable mirrored, its copies identical
    assert r["state"] < tolerance["state"], r  # every model and optimizer variable
    assert r["history"] < tolerance["history"] and r["history_keys"], (
        r
    )  # loss, nll, compiled / particle / bound
    assert r["evaluate"] < tolerance["evaluate"] and r["predict"] < tolerance["predict"], r


@pytest.mark.subprocess
@pytest.mark.parametrize("name", FIT_RUNS)
def test_two_replicas_equal_one_device_with_fit(fit_results, name):
    _check(fit_results[(name, "fit")])


@pytest.mark.subprocess
@pytest.mark.slow
def test_two_replicas_equal_one_device_with_fit_for_the_other_runs():
    results = _run("--loop=fit", *SLOW_FIT_RUNS)
    assert sorted(name for name, _ in results) == sorted(SLOW_FIT_RUNS)
    for key in results:
        _check(results[key])


@pytest.mark.subprocess
@pytest.mark.parametrize("name", CUSTOM_LOOP_RUNS)
def test_two_replicas_equal_one_device_in_the_custom_loop(custom_loop_results, name):
    _check(custom_loop_results[(name, "custom")])


@pytest.mark.subprocess
@pytest.mark.slow
def test_two_replicas_equal_one_device_in_the_custom_loop_for_every_run():
    results = _run("--loop=custom", *[n for n in RUNS if n != "keras_adam"])
    for key in results:
        _check(results[key])


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.subprocess
def test_two_workers_on_localhost_equal_one_process(tmp_path):
    """MultiWorkerMirroredStrategy: two worker processes (TF_CONFIG on 127.0.0.1) train GPF, MGVBP (full, and
    diagonal with the empirical Fisher, which gathers curvature records) and MatrixSVGD (KFAC) one after the
    other with fit; both end with the single process's weights, optimizer state, loss history and step count."""
    script = os.path.join(SCRIPTS, "multi_worker_check.py")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    ports = ",".join(str(p) for p in _free_ports(2))
    workers = [
        subprocess.Popen(
            [sys.executable, script, "worker", str(i), ports, str(tmp_path / f"w{i}.npz")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        single = subprocess.run(
            [sys.executable, script, "single", str(tmp_path / "s.npz")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert single.returncode == 0, single.stderr[-3000:]
        for w in workers:
            _, err = w.communicate(timeout=300)
            assert w.returncode == 0, err[-3000:]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    one = np.load(tmp_path / "s.npz")
    first, second = np.load(tmp_path / "w0.npz"), np.load(tmp_path / "w1.npz")
    for method in ("gpf", "mgvbp", "mgvbp_fisher", "matrix_svgd"):
        assert int(one[f"{method}/iterations"]) == int(first[f"{method}/iterations"]) == 12
    for key in one.files:
        a = one[key].astype(np.float64)
        assert np.max(np.abs(a - first[key])) <= TOLERANCE * (1 + np.max(np.abs(a))), key
        np.testing.assert_array_equal(first[key], second[key])  # the workers hold the same state


@pytest.mark.subprocess
def test_what_is_not_supported_is_refused_with_what_works():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, SCRIPT, "--refusals"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    told = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert (
        told["particles_with_curvature"][0] == "ValueError"
        and "parallel='data'" in told["particles_with_curvature"][1]
    )
    assert (
        told["particles_not_divisible"][0] == "ValueError"
        and "multiple of 2" in told["particles_not_divisible"][1]
    )
    assert (
        told["unknown_parallel"][0] == "ValueError"
        and "'data' or 'particles'" in told["unknown_parallel"][1]
    )
    kind, message = told["built_outside_the_scope"]
    assert kind == "ValueError" and "strategy.scope()" in message
    kind, message = told["custom_loop_without_run"]
    assert kind == "ValueError" and "strategy.run" in message
    for case in (
        "keras_dropout",
        "keras_augmentation",
        "keras_dropout_custom_loop",
    ):  # the same noise per replica
        kind, message = told[case]
        assert kind == "ValueError" and "draws random numbers for its own input only" in message, (
            told[case]
        )
        assert (
            "bayes_keras.layers.Dropout / GaussianNoise / GaussianDropout" in message
            and "tf.data" in message
        )
    assert "bayesian_gradients: layer 'dropout" in told["keras_dropout_custom_loop"][1]
    assert told["keras_augmentation"][1].index("tf.data") < told["keras_augmentation"][1].index(
        "bayes_keras.layers"
    )
    kind, message = told["central_storage"]
    assert (
        kind == "NotImplementedError"
        and "MirroredStrategy" in message
        and "MultiWorkerMirroredStrategy" in message
    )


@pytest.mark.subprocess
def test_refinement_under_two_replicas_equals_one_device():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, SCRIPT, "--refine"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert r["moved"] > 1e-3, r  # refinement changed the particles
    assert r["refined"] < TOLERANCE and r["predictive"] < TOLERANCE, r


@pytest.mark.subprocess
def test_evaluate_and_validation_with_batches_the_replicas_do_not_divide():
    """Global batches of 1 (one replica gets nothing) and 15 (8 + 7): evaluate's and the validation's numbers
    are those of one device (each metric over all replicas' examples, not an equal-weight mean of replicas)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, SCRIPT, "--uneven"], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert r["1"] < TOLERANCE and r["15"] < TOLERANCE, r


@pytest.mark.subprocess
def test_several_strategies_methods_and_models_in_one_process_each_equal_one_device():
    """GPF, MGVBP (empirical Fisher) and MatrixSVGD (KFAC) in one process, each under a new MirroredStrategy,
    in both orders, and all under one shared strategy, and the first ones trained again after the others: each
    ends equal to its one-device run (TensorFlow numbers every strategy's collectives from the same keys; the
    library gives each strategy its own)."""
    script = os.path.join(os.path.dirname(SCRIPT), "many_strategies_check.py")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    methods = ("gpf", "mgvbp_fisher", "matrix_svgd")
    for run in (
        "new_strategy_each",
        "new_strategy_each_reversed",
        "one_strategy",
        "trained_again_after_the_others",
    ):
        for method in methods:
            assert found[f"{run}/{method}"] <= TOLERANCE, (run, method, found)
    for method in methods:
        assert found[f"moved_by_training/{method}"] > 1000 * TOLERANCE, found
