"""Writes that a crash cannot half-do: a save or an export replaces the previous one in one step.

`replace_file(path, write)` has `write(temporary_path)` write the new file beside the target (same
directory, so the same file system), flushes it to disk, and renames it over the target: after a crash
(SIGKILL, power loss, a full disk) the target holds the old file or the new one, never a partial one.

A SavedModel is a directory, which no rename swaps in one step. `replace_directory(path, write)` writes
the new one beside the target, then moves the old one to `path + BACKUP_SUFFIX`, moves the new one in,
and deletes the backup: after a crash at any point, `path` holds the old or the new export, or, if it
is missing, `path + BACKUP_SUFFIX` holds the old one.
"""

import os
import shutil
import uuid

BACKUP_SUFFIX = ".backup"


def _temporary(path, suffix=""):
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp{suffix}")


def _sync_directory(directory):
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # a platform without directory descriptors (Windows): the rename is what there is
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _sync_tree(root):
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb+") as f:
                os.fsync(f.fileno())
        _sync_directory(directory)


def replace_file(path, write, suffix=""):
    """Write a file with `write(temporary_path)` and put it at `path` in one rename; returns `path`.
    `suffix` ends the temporary file's name (a writer may check the extension, as Keras checks ".keras")."""
    path = os.fspath(path)
    temporary = _temporary(path, suffix)
    try:
        write(temporary)
        with open(temporary, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    _sync_directory(os.path.dirname(os.path.abspath(path)))
    return path


def replace_directory(path, write):
    """Write a directory with `write(temporary_path)` and swap it in for `path` (see the module docstring)."""
    path = os.fspath(path).rstrip(os.sep)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"Cannot export to {path!r}: a file (not an export directory) is there.")
    temporary = _temporary(path)
    backup = path + BACKUP_SUFFIX
    try:
        write(temporary)
        _sync_tree(temporary)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    if os.path.isdir(backup) and os.path.isdir(path):
        shutil.rmtree(backup)  # a backup left by an earlier crash, while the target holds an export
    if os.path.isdir(path):
        os.replace(path, backup)
    os.replace(temporary, path)
    _sync_directory(os.path.dirname(os.path.abspath(path)))
    shutil.rmtree(backup, ignore_errors=True)
    return path
