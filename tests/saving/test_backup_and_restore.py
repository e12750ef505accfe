"""bayes_keras.callbacks.BackupAndRestore: a training job SIGKILLed at random moments (during a step or during
a checkpoint write) and run again resumes to the weights of the uninterrupted run, and leaves no files behind
(issue: the API's edges, resumable checkpoints)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings

import h5py
import keras
import numpy as np
import pytest

import bayes_keras as bk
from paths import SCRIPTS

SCRIPT = os.path.join(SCRIPTS, "resume_train.py")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _run(method, backup, out, kill_after=None, delay=0.0):
    """Run the training script; with `kill_after`, SIGKILL it `delay` seconds after it reports that many
    trained batches. Returns the number of batches it reported, and whether it completed."""
    child = subprocess.Popen(
        [sys.executable, SCRIPT, method, backup, out],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    batches, done = 0, False
    try:
        for line in child.stdout:
            if line.startswith("batch"):
                batches += 1
                if kill_after is not None and batches >= kill_after:
                    time.sleep(delay)
                    child.send_signal(signal.SIGKILL)
                    break
            elif line.startswith("done"):
                done = True
        child.wait(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if kill_after is None:
        assert child.returncode == 0 and done, child.stderr.read()[-3000:]
    return batches, done


def _weights(path):
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def _kills(tmp_path, method, kills, seed):
    reference = str(tmp_path / "reference.npz")
    _run(method, str(tmp_path / "reference_backup"), reference)
    assert not os.path.exists(tmp_path / "reference_backup"), (
        "the checkpoint is removed when fit completes"
    )
    rng = random.Random(seed)
    backup, out = str(tmp_path / "backup"), str(tmp_path / "resumed.npz")
    killed = 0
    while killed < kills:
        batches, done = _run(
            method, backup, out, kill_after=rng.randint(1, 6), delay=rng.uniform(0.0, 0.03)
        )
        if done:  # the kill came after the last step: start over, as a fresh job would
            os.remove(out)
            continue
        killed += 1
        held = os.listdir(backup) if os.path.isdir(backup) else []
        assert set(held) <= {"latest.weights.h5"} | {
            f for f in held if f.startswith(".latest.weights.h5.")
        }, held
    batches, done = _run(method, backup, out)
    assert done
    assert not os.path.exists(backup), os.listdir(
        backup
    )  # no checkpoint, no temporaries of killed writes
    for resumed, uninterrupted in zip(_weights(out), _weights(reference), strict=True):
        np.testing.assert_allclose(resumed, uninterrupted, atol=1e-6, rtol=0)


@pytest.mark.subprocess
@pytest.mark.parametrize("method", ["mgvbp", pytest.param("gpf", marks=pytest.mark.slow)])
def test_killed_jobs_resume_to_the_uninterrupted_weights(tmp_path, method):
    # 3 epochs of 12 batches; each kill lands 1-6 batches after a (re)start (counting the batches a resumed
    # run skips), 0-30 ms after a batch ended, while the next step runs or the checkpoint is written (one
    # after every batch).
    _kills(tmp_path, method, kills=3, seed={"gpf": 0, "mgvbp": 1}[method])


@pytest.mark.subprocess
@pytest.mark.slow
def test_twenty_kills_resume_to_the_uninterrupted_weights(tmp_path):
    _kills(tmp_path, "mgvbp", kills=20, seed=2)


@pytest.mark.subprocess
def test_a_kill_after_an_epochs_last_checkpoint_resumes_at_the_next_epoch(tmp_path):
    """Killed during validation, after the checkpoint of the epoch's last batch: the resumed fit has no batch of
    that epoch left to run (Keras' compiled metrics, never updated, could not report); it starts the next epoch."""

    def run(backup, out, *mode):
        done = subprocess.run(
            [sys.executable, SCRIPT, "gpf", str(tmp_path / backup), str(tmp_path / out), *mode],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return done.returncode, done.stderr

    assert run("a", "reference.npz", "validation")[0] == 0
    assert run("b", "resumed.npz", "validation", "kill")[0] == -signal.SIGKILL
    code, err = run("b", "resumed.npz", "validation")
    assert code == 0, err[-2000:]
    for resumed, uninterrupted in zip(
        _weights(str(tmp_path / "resumed.npz")),
        _weights(str(tmp_path / "reference.npz")),
        strict=True,
    ):
        np.testing.assert_allclose(resumed, uninterrupted, atol=1e-6, rtol=0)


def _model():
    inputs = keras.Input((4,))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(3, num_particles=2)(inputs), likelihood="categorical"
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(32, 4)).astype("float32"), rng.integers(0, 3, 32)


def test_the_checkpoint_is_one_file_naming_where_training_was(tmp_path):
    x, y = _data()
    model = _model()
    callback = bk.callbacks.BackupAndRestore(
        str(tmp_path / "b"), save_freq=3, delete_checkpoint=False
    )
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    assert os.listdir(tmp_path / "b") == ["latest.weights.h5"]
    with h5py.File(tmp_path / "b" / "latest.weights.h5", "r") as f:
        assert (
            f.attrs["bayes_keras_resume"] == '{"epoch": 1, "batch": 2}'
        )  # 8 batches, the 6th was the last saved
    user_file = tmp_path / "b" / "notes.txt"
    user_file.write_text("mine")
    model.fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        verbose=0,
        callbacks=[bk.callbacks.BackupAndRestore(str(tmp_path / "b"), save_freq="epoch")],
    )
    assert os.listdir(tmp_path / "b") == [
        "notes.txt"
    ]  # its own checkpoint removed, the user's file kept


def test_bad_arguments_and_foreign_files_are_refused(tmp_path):
    for bad in (0, -1, 2.5, True, "batch"):
        with pytest.raises(ValueError, match=f"save_freq.*{bad!r}"):
            bk.callbacks.BackupAndRestore(str(tmp_path), save_freq=bad)
    with pytest.raises(ValueError, match="backup_dir"):
        bk.callbacks.BackupAndRestore("")
    assert bk.callbacks.BackupAndRestore(str(tmp_path), save_freq=np.int64(2)).save_freq == 2
    (tmp_path / "c").mkdir()
    model = _model()
    model.save_weights(
        str(tmp_path / "c" / "latest.weights.h5")
    )  # Keras' callback's file: no position in it
    x, y = _data()
    with pytest.raises(ValueError, match="not a checkpoint this callback wrote"):
        model.fit(x, y, verbose=0, callbacks=[bk.callbacks.BackupAndRestore(str(tmp_path / "c"))])
    other = keras.Sequential(
        [keras.Input((4,)), bk.layers.Dense(5, num_particles=2), bk.layers.Dense(3)]
    )
    other = bk.BayesianModel(other.inputs, other.outputs, likelihood="categorical")
    other.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    other.fit(
        x,
        y,
        verbose=0,
        epochs=1,
        callbacks=[bk.callbacks.BackupAndRestore(str(tmp_path / "d"), delete_checkpoint=False)],
    )
    with pytest.raises(
        ValueError, match="checkpoint '.*d/latest.weights.h5' does not fit this model"
    ):
        model.fit(x, y, verbose=0, callbacks=[bk.callbacks.BackupAndRestore(str(tmp_path / "d"))])


def test_keras_own_callback_is_pointed_to_ours(tmp_path):
    x, y = _data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _model().fit(
            x,
            y,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=2)],
        )
    assert any("bayes_keras.callbacks.BackupAndRestore" in str(w.message) for w in caught)


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_mirrored_run_resumes_to_the_uninterrupted_weights(tmp_path):
    script = os.path.join(SCRIPTS, "resume_mirrored.py")

    def run(backup, *stop):
        out = subprocess.run(
            [sys.executable, script, str(tmp_path / backup), *stop],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return out.returncode, out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""

    code, reference = run("a")
    assert code == 0, reference
    assert run("b", "11")[0] == 9  # stopped after step 11 of 16, mid-epoch 2
    code, resumed = run("b")
    assert code == 0
    for r, u in zip(json.loads(resumed), json.loads(reference), strict=True):
        np.testing.assert_allclose(np.asarray(r), np.asarray(u), atol=1e-6, rtol=0)
