"""BackupAndRestore: Keras' fault-tolerance callback, with checkpoints a kill cannot half-write and a resume
that continues inside the epoch."""

import json
import os

import h5py
import keras
import numpy as np
import tensorflow as tf

from bayes_keras.saving import atomic_files

_WEIGHTS = "latest.weights.h5"
_STATE = "bayes_keras_resume"  # attribute of the weights file: where in training it was written
# group of the weights file: the layers' random generator states
_RANDOM = "bayes_keras_random_states"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Back up the training state during `fit` and resume from it when a killed job runs `fit` again.

    A drop-in for `keras.callbacks.BackupAndRestore` (same arguments, same directory), which writes its
    checkpoint over the previous one: a job killed during that write cannot resume ("bad object header
    version number"), and a checkpoint written inside an epoch (integer `save_freq`) resumes at the start of
    the epoch, so the epoch's first steps are taken twice. This callback

    - writes each checkpoint to a temporary file beside the last one (weights, optimizer state, random
      generator states, and where in training it was taken, in one `.weights.h5`), flushes it to disk and
      renames it over the last one: after a kill at any moment the directory holds the last complete
      checkpoint; the temporary files of killed writes are removed when training resumes;
    - resumes where the checkpoint was taken: in the interrupted epoch, the batches already trained are
      read from the data and skipped (no update), so every later step sees the batch and the random draws
      it would have seen. A resumed run then ends with the uninterrupted run's weights when the data order
      is reproducible: `keras.utils.set_random_seed` before building the model and arrays with
      `shuffle=True` or `False` (Keras then draws the same order in a new process), or a `tf.data` pipeline
      whose order does not depend on how often it was iterated in this process.

    Keras' metric averages of the interrupted epoch and the state of other callbacks (EarlyStopping's
    patience, for instance) are not in the checkpoint; the epoch's logged averages cover the steps after the
    resume. Written for one process (one device or `tf.distribute.MirroredStrategy`).

    Args:
        backup_dir: directory for the checkpoint (made if missing). Only this callback's files in it are
            written or removed.
        save_freq: `"epoch"` (at the end of every epoch) or a positive integer: every that many batches.
        double_checkpoint: accepted for compatibility with Keras' callback; a checkpoint here is never
            half-written, so the one copy is kept.
        delete_checkpoint: remove the checkpoint when `fit` completes (default True); False keeps it.

    Example:

    ```python
    keras.utils.set_random_seed(0)
    model = bayes_keras.zoo.lenet5(...)
    model.compile(optimizer=bayes_keras.optimizers.GaussianParticleFlow())
    model.fit(x, y, epochs=10,
              callbacks=[bayes_keras.callbacks.BackupAndRestore("backup", save_freq=100)])
    # killed? run the same script again: fit continues from the last checkpoint.
    ```
    """

    def __init__(
        self, backup_dir, save_freq="epoch", double_checkpoint=False, delete_checkpoint=True
    ):
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise ValueError(
                f"BackupAndRestore: backup_dir must be a directory path; got {backup_dir!r}."
            )
        if not (
            save_freq == "epoch"
            or (
                isinstance(save_freq, (int, np.integer))
                and not isinstance(save_freq, bool)
                and save_freq > 0
            )
        ):
            raise ValueError(
                f"BackupAndRestore: save_freq must be 'epoch' or a positive integer (a number of "
                f"batches); got {save_freq!r}."
            )
        for name, value in (
            ("double_checkpoint", double_checkpoint),
            ("delete_checkpoint", delete_checkpoint),
        ):
            if not isinstance(value, bool):
                raise ValueError(f"BackupAndRestore: {name} must be True or False; got {value!r}.")
        save_freq = save_freq if save_freq == "epoch" else int(save_freq)
        super().__init__(
            os.fspath(backup_dir),
            save_freq=save_freq,
            double_checkpoint=False,
            delete_checkpoint=delete_checkpoint,
        )
        self.path = os.path.join(self.backup_dir, _WEIGHTS)
        self._epoch = 0
        self._since_save = 0
        self._resume_at = None  # (epoch, batches already trained in it)
        self._skipping = False
        self._train_function = None

    def on_train_begin(self, logs=None):
        self._since_save = 0
        self._resume_at = None
        self._train_function = self.model.train_function
        atomic_files.remove_leftovers(self.path)
        if not os.path.exists(self.path):
            return
        if not self.model.built:
            raise ValueError(
                "BackupAndRestore: the model must be built before fit() to restore its checkpoint "
                f"{self.path!r}: call it on a batch of data (or give it an Input) first."
            )
        epoch, batch = _where(self.path)
        steps = self.params.get("steps") if self.params else None
        # taken after the epoch's last batch: resume at the next epoch
        if steps is not None and batch >= steps:
            epoch, batch = (
                epoch + 1,
                0,
            )  # (no batch of that epoch left to run; Keras' metrics need one)
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        try:
            self.model.load_weights(self.path)
        except ValueError as error:
            raise ValueError(
                f"BackupAndRestore: the checkpoint {self.path!r} does not fit this model (written for "
                f"another one?): {str(error)[:300]}. Move it away, or give another backup_dir."
            ) from None
        _load_random_states(self.model, self.path)
        self.model._initial_epoch = epoch  # how Keras' own callback tells fit where to start
        self._resume_at = (epoch, batch)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self._skipping = (
            self._resume_at is not None
            and self._resume_at[0] == self._epoch
            and batch < self._resume_at[1]
        )
        self.model.train_function = self._skip if self._skipping else self._train_function

    def on_train_batch_end(self, batch, logs=None):
        # nothing new to save (and a position before the checkpoint's must not be written)
        if self._skipping:
            return
        self._since_save += self.model.steps_per_execution
        if self.save_freq != "epoch" and self._since_save >= self.save_freq:
            self._save(self._epoch, batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self.model.train_function = self._train_function
        self._resume_at = None
        if self.save_freq == "epoch":
            self._save(epoch + 1, 0)

    def on_train_end(self, logs=None):
        self.model.train_function = self._train_function
        if self.delete_checkpoint:
            if os.path.exists(self.path):
                os.remove(self.path)
            atomic_files.remove_leftovers(self.path)
            try:
                os.rmdir(self.backup_dir)  # only if nothing of the user's is in it
            except OSError:
                pass

    def _save(self, epoch, batch):
        self._since_save = 0
        os.makedirs(self.backup_dir, exist_ok=True)

        def write(temporary):
            self.model.save_weights(temporary)
            with h5py.File(temporary, "a") as f:
                f.attrs[_STATE] = json.dumps({"epoch": int(epoch), "batch": int(batch)})
                states = f.create_group(_RANDOM)
                for i, variable in enumerate(_random_states(self.model)):
                    states.create_dataset(str(i), data=variable.numpy())

        atomic_files.replace_file(self.path, write, suffix=".weights.h5")

    def _skip(self, iterator):
        """What fit runs instead of a training step on a batch trained before the kill: read it, no update."""
        for _ in range(self.model.steps_per_execution):
            if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                if not iterator.get_next_as_optional().has_value():
                    raise StopIteration
            else:
                next(iterator)
        return {}


def _random_states(model):
    """The states of the model's random generators (Dropout's, GaussianNoise's...): `variables` beyond `weights`,
    which save_weights leaves out."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def _load_random_states(model, path):
    variables = _random_states(model)
    with h5py.File(path, "r") as f:
        saved = [f[_RANDOM][str(i)][()] for i in range(len(f[_RANDOM]))] if _RANDOM in f else []
    if len(saved) != len(variables) or any(
        np.shape(s) != tuple(v.shape) for s, v in zip(saved, variables)
    ):
        raise ValueError(
            f"BackupAndRestore: {path!r} holds {len(saved)} random generator states; this model has "
            f"{len(variables)} ({[v.path for v in variables]}): it was written for another model."
        )
    for value, variable in zip(saved, variables):
        variable.assign(value)


def _where(path):
    """(epoch, batches trained in it) that the checkpoint at `path` was written at."""
    try:
        with h5py.File(path, "r") as f:
            state = json.loads(f.attrs[_STATE])
        epoch, batch = state["epoch"], state["batch"]
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise ValueError(
            f"BackupAndRestore: {path!r} is not a checkpoint this callback wrote (it names no "
            f"training position: {error}). Move it away, or give another backup_dir."
        ) from None
    if not (isinstance(epoch, int) and isinstance(batch, int) and epoch >= 0 and batch >= 0):
        raise ValueError(
            f"BackupAndRestore: {path!r} names an invalid training position (epoch={epoch!r}, "
            f"batch={batch!r}); expected non-negative integers."
        )
    return epoch, batch
