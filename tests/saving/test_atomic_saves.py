"""A save or an export over a good one leaves the old one or the new one after any crash (issue: nothing
lost). A child process saves in a loop and is killed (SIGKILL) at random moments; a full disk is a
writer raising ENOSPC half way."""

import errno
import os
import random
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from bayes_keras.saving import atomic_files
import bayes_keras as bk
from paths import SCRIPTS

SCRIPT = os.path.join(SCRIPTS, "save_loop.py")


def _kill_during_saves(mode, target, kills, seed):
    """Start the save loop `kills` times, SIGKILL it at a random moment after its first save; after each
    kill yield what is on disk."""
    rng = random.Random(seed)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for k in range(kills):
        ready = f"{target}.ready{k}"
        child = subprocess.Popen(
            [sys.executable, SCRIPT, mode, target, ready],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.time() + 240
            while not os.path.exists(ready):
                assert child.poll() is None, child.stderr.read().decode()[-3000:]
                assert time.time() < deadline, "the save loop did not start"
                time.sleep(0.05)
            time.sleep(
                rng.uniform(0.0, 1.5 if mode == "save" else 4.0)
            )  # several saves: a kill mid-write
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        yield


def _versions(weights):
    """The version a saved model holds: all its particle weights equal one number."""
    values = {float(v) for w in weights if w.ndim for v in np.unique(w)}
    assert len(values) == 1, values  # one whole version, not a mixture
    return values.pop()


def _hidden(directory):
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


def _check_saves(tmp_path, kills):
    target = str(tmp_path / "model.keras")
    seen = []
    for _ in _kill_during_saves("save", target, kills, seed=kills):
        model = keras.saving.load_model(target)  # never "File is not a zip file"
        seen.append(_versions(model.get_weights()))
    assert all(v >= 1 for v in seen)
    _model(9).save(target)  # the next save removes what the killed ones left
    assert _hidden(tmp_path) == []
    assert _versions(keras.saving.load_model(target).get_weights()) == 9.0


@pytest.mark.subprocess
def test_save_killed_at_random_moments_leaves_a_loadable_file(tmp_path):
    _check_saves(tmp_path, kills=4)


@pytest.mark.subprocess
@pytest.mark.slow
def test_save_killed_twenty_times_leaves_a_loadable_file(tmp_path):
    _check_saves(tmp_path, kills=20)


@pytest.mark.subprocess
def test_export_killed_at_random_moments_leaves_a_loadable_export(tmp_path):
    target = str(tmp_path / "served")
    for _ in _kill_during_saves("export", target, kills=3, seed=0):
        path = target if os.path.isdir(target) else atomic_files.backups(target)[0]
        served = tf.saved_model.load(
            path
        )  # the export, or the documented backup of the previous one
        probs = served.predictive(tf.zeros((2, 4)))["probabilities"].numpy()
        np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)
    _model(9).export(
        target, verbose=False
    )  # the next export removes the killed ones' temporaries and backups
    assert _hidden(tmp_path) == []


def _model(version):
    inputs = keras.Input((4,))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(3, num_particles=2)(inputs), likelihood="categorical"
    )
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
    model.set_weights(
        [np.full(w.shape, version, w.dtype) if w.ndim else w for w in model.get_weights()]
    )
    return model


def test_full_disk_keeps_the_old_file(tmp_path, monkeypatch):
    target = str(tmp_path / "model.keras")
    _model(1).save(target)
    before = sorted(os.listdir(tmp_path))

    def full_disk(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(keras.Model, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        _model(2).save(target)
    monkeypatch.undo()
    assert _versions(keras.saving.load_model(target).get_weights()) == 1.0
    assert sorted(os.listdir(tmp_path)) == before  # the partial temporary file is removed


def test_full_disk_during_export_keeps_the_old_export(tmp_path, monkeypatch):
    target = str(tmp_path / "served")
    _model(1).export(target, verbose=False)

    def full_disk(root):  # the disk fills while the new export is flushed
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_files, "_sync_tree", full_disk)
    with pytest.raises(OSError, match="No space left"):
        _model(2).export(target, verbose=False)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["served"]
    tf.saved_model.load(target)


def test_save_and_export_still_replace_what_is_there(tmp_path):
    target = str(tmp_path / "model.keras")
    _model(1).save(target)
    _model(2).save(target)
    assert _versions(keras.saving.load_model(target).get_weights()) == 2.0
    served = str(tmp_path / "served")
    _model(1).export(served, verbose=False)
    _model(2).export(served, verbose=False)
    assert sorted(os.listdir(tmp_path)) == ["model.keras", "served"]


def test_export_keeps_a_users_directory_and_backup(tmp_path):
    """An export replaces only an export: a directory of the user's files is refused before any work, and a
    `served.backup` the user made beside the target is never touched."""
    results = tmp_path / "results"
    results.mkdir()
    for name in ("a.csv", "b.txt", "notes.md"):
        (results / name).write_text(name)
    with pytest.raises(
        ValueError, match="'.*results'.*holds files of its own \\(a.csv, b.txt, notes.md\\)"
    ):
        _model(1).export(str(results), verbose=False)
    assert sorted(os.listdir(results)) == ["a.csv", "b.txt", "notes.md"]
    assert sorted(os.listdir(tmp_path)) == ["results"]
    mine = tmp_path / "served.backup"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    served = str(tmp_path / "served")
    _model(1).export(served, verbose=False)
    _model(2).export(served, verbose=False)  # over the earlier export: replaced
    assert (mine / "keep.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["results", "served", "served.backup"]
    empty = tmp_path / "empty"
    empty.mkdir()
    _model(1).export(str(empty), verbose=False)  # an empty directory is taken
    tf.saved_model.load(str(empty))
    (tmp_path / "served" / "README_mine.txt").write_text(
        "notes"
    )  # a file the user added to an export
    with pytest.raises(
        ValueError,
        match=r"earlier export there holds files that are not part of a SavedModel "
        r"\(README_mine.txt\)",
    ):
        _model(2).export(served, verbose=False)
    assert (tmp_path / "served" / "README_mine.txt").read_text() == "notes"
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match="Cannot export to filepath '': give a directory path"):
        _model(1).export("", verbose=False)
    assert sorted(os.listdir(tmp_path)) == before


def test_save_to_a_directory_is_refused(tmp_path):
    (tmp_path / "m.keras").mkdir()
    with pytest.raises(ValueError, match="filepath '.*m.keras' is a directory"):
        _model(1).save(str(tmp_path / "m.keras"))
