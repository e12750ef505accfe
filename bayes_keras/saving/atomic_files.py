"""Writes that a crash cannot half-do, and that touch nothing but what they own.

`replace_file(path, write)` has `write(temporary_path)` write the new file beside the target (same
directory, so the same file system), flushes it to disk, and renames it over the target: after a crash
(SIGKILL, power loss, a full disk) the target holds the old file or the new one, never a partial one.

A SavedModel is a directory, which no rename swaps in one step. `replace_directory(path, write)` writes
the new one beside the target, then moves the old one aside to a hidden backup, moves the new one in,
and deletes the backup: after a crash at any point, `path` holds the old or the new export, or, if it
is missing, `backups(path)[0]` holds the old one. It replaces only an export: an existing directory that
holds anything else is refused, and a directory the user made beside it (`served.backup`) is never touched.

Temporary files and backups are named `.{name}.{pid}.{random}.tmp...` / `.backup` after the process that
made them. The next write to the same path removes those whose process has ended (a killed save's), so
nothing accumulates; those of a live process (a save in progress elsewhere) are left alone.
"""

import os
import re
import shutil
import threading
import uuid

_IN_FLIGHT = set()  # this process's temporaries and backups being written now
_LOCK = threading.Lock()


def _made_here(path, kind, suffix=""):
    directory, name = os.path.split(os.path.abspath(path))
    made = os.path.join(directory, f".{name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.{kind}{suffix}")
    with _LOCK:
        _IN_FLIGHT.add(made)
    return made


def _done(made):
    with _LOCK:
        _IN_FLIGHT.discard(made)


def _alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        # another user's process (PermissionError), or a platform without signals: assume alive
        return True
    return True


def _leftovers(path, kind):
    """(pid, full path, modification time) of the temporaries or backups that writes to `path` made."""
    directory, name = os.path.split(os.path.abspath(path))
    pattern = re.compile(rf"\.{re.escape(name)}\.(\d+)\.[0-9a-f]{{12}}\.{kind}")
    found = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return found
    for entry in entries:
        match = pattern.match(entry)
        if match:
            full = os.path.join(directory, entry)
            try:
                found.append((int(match.group(1)), full, os.path.getmtime(full)))
            except OSError:  # removed meanwhile
                pass
    return found


def _remove(full):
    if os.path.isdir(full) and not os.path.islink(full):
        shutil.rmtree(full, ignore_errors=True)
    else:
        try:
            os.remove(full)
        except OSError:
            pass


def _clean(path, kind):
    """Remove the leftovers of `kind` that ended processes (or this one, before this write) made for `path`."""
    for pid, full, _ in _leftovers(path, kind):
        with _LOCK:
            busy = full in _IN_FLIGHT
        if not busy and (pid == os.getpid() or not _alive(pid)):
            _remove(full)


def remove_leftovers(path):
    """Remove the temporaries that killed writes to `path` left (those of ended processes)."""
    _clean(os.fspath(path), "tmp")


def backups(path):
    """The backups of the export at `path` that interrupted exports left, newest first: if a crash left `path`
    missing, `backups(path)[0]` is the previous export (load it with tf.saved_model.load)."""
    return [
        full
        for _, full, _ in sorted(
            _leftovers(os.fspath(path).rstrip(os.sep), "backup"), key=lambda found: -found[2]
        )
    ]


def _sync_directory(directory):
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        # a platform without directory descriptors (Windows): the rename is what there is
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
    if os.path.isdir(path):
        raise ValueError(f"Cannot save to {path!r}: it is a directory; give a file path.")
    _clean(path, "tmp")
    temporary = _made_here(path, "tmp", suffix)
    try:
        write(temporary)
        with open(temporary, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    finally:
        _done(temporary)
    _sync_directory(os.path.dirname(os.path.abspath(path)))
    return path


_SAVED_MODEL_ENTRIES = {
    "saved_model.pb",
    "saved_model.pbtxt",
    "variables",
    "assets",
    "fingerprint.pb",
    "keras_metadata.pb",
}  # what a SavedModel directory holds


def is_export(path):
    """Whether the directory `path` holds a SavedModel (what an export writes) and so may be replaced."""
    return os.path.isfile(os.path.join(path, "saved_model.pb"))


def replace_directory(path, write):
    """Write a directory with `write(temporary_path)` and swap it in for `path` (see the module docstring). An
    existing `path` must be an export (a SavedModel) or empty: anything else is refused before any work."""
    if not os.fspath(path).strip():
        raise ValueError(f"Cannot export to filepath {path!r}: give a directory path.")
    path = os.fspath(path).rstrip(os.sep)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            f"Cannot export to filepath {path!r}: a file (not an export directory) is there."
        )
    if os.path.isdir(path) and not is_export(path) and os.listdir(path):
        held = sorted(os.listdir(path))
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise ValueError(
            f"Cannot export to filepath {path!r}: it is a directory that holds files of its own ({shown}), not "
            "an earlier export, and an export replaces the whole directory. Choose a new path (or "
            "move those files away first)."
        )
    added = (
        sorted(set(os.listdir(path)) - _SAVED_MODEL_ENTRIES)
        if os.path.isdir(path) and is_export(path)
        else []
    )
    if added:
        raise ValueError(
            f"Cannot export to filepath {path!r}: the earlier export there holds files that are not part "
            f"of a SavedModel ({', '.join(added[:5])}), which replacing it would delete. Move them away "
            "first, or choose a new path."
        )
    _clean(path, "tmp")
    temporary = _made_here(path, "tmp")
    try:
        write(temporary)
        _sync_tree(temporary)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        _done(temporary)
        raise
    backup = _made_here(path, "backup")
    try:
        if os.path.isdir(path):
            os.replace(path, backup)
        os.replace(temporary, path)
        _sync_directory(os.path.dirname(os.path.abspath(path)))
        shutil.rmtree(backup, ignore_errors=True)
    finally:
        _done(temporary)
        _done(backup)
    _clean(path, "backup")  # those of earlier, interrupted exports: `path` holds an export now
    return path
