"""load_model: keras.saving.load_model with the file checked first, so a damaged or hostile file is refused with
a message that says what is wrong with it, before Keras reads it."""

import os
import zipfile

import keras

# a .keras file's config.json; the largest KerasHub configs are a few MB
MAX_CONFIG_BYTES = 64 * 2**20


def load_model(filepath, custom_objects=None, compile=True, safe_mode=True):
    """Load a model saved with `model.save("name.keras")`: `keras.saving.load_model`, after checking that the file
    is a complete .keras archive (a truncated copy, a file that is not a zip archive or whose contents fail their
    checksums is refused naming the file) and that its config.json is at most `MAX_CONFIG_BYTES` (64 MiB)
    unpacked (Keras reads it whole into memory). The loaded model's state is validated as Keras loads it
    (finite values, positive scales...). Arguments as `keras.saving.load_model`.

    Example:
        >>> model.save("digits.keras")
        >>> model = bayes_keras.load_model("digits.keras")
    """
    if not isinstance(filepath, (str, os.PathLike)):
        raise ValueError(
            f"load_model: filepath must be the path of a .keras file; got {filepath!r}."
        )
    path = os.fspath(filepath)
    if os.path.isdir(path):
        raise ValueError(
            f"load_model: filepath {path!r} is a directory; give the .keras file (an export, a "
            "SavedModel directory, loads with tf.saved_model.load)."
        )
    if not os.path.exists(path):
        raise FileNotFoundError(f"load_model: filepath {path!r} does not exist.")
    if not path.endswith(".keras"):
        raise ValueError(
            f"load_model: filepath {path!r} does not end in .keras (what model.save writes)."
        )
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            head = f.read(4)
        what = (
            "a truncated .keras file (it starts as a zip archive but its end is missing: an interrupted copy?)"
            if head == b"PK\x03\x04"
            else "not a .keras file (not a zip archive)"
        )
        raise ValueError(f"load_model: filepath {path!r} is {what}.")
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
            config = next((i for i in archive.infolist() if i.filename == "config.json"), None)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ValueError(
            f"load_model: filepath {path!r} is a damaged .keras archive ({error})."
        ) from None
    if damaged is not None:
        raise ValueError(
            f"load_model: filepath {path!r} is a damaged .keras archive: {damaged!r} fails its "
            "checksum."
        )
    if config is None:
        raise ValueError(
            f"load_model: filepath {path!r} holds no config.json: not a .keras model file."
        )
    if config.file_size > MAX_CONFIG_BYTES:
        raise ValueError(
            f"load_model: filepath {path!r} has a config.json of {config.file_size:,} bytes unpacked, "
            f"above the {MAX_CONFIG_BYTES:,} this loader reads (a model's config is at most a few MB)."
        )
    return keras.saving.load_model(
        path, custom_objects=custom_objects, compile=compile, safe_mode=safe_mode
    )
