"""The trained part of a fine-tuned model alone: save and load a BayesianModel's trainable weights (a LoRA model's
factors and its head's particles) without the frozen weights they adapt."""

import os

import keras
import numpy as np

from bayes_keras.saving import atomic_files
from bayes_keras.layers.lora_einsum_dense import LoRAEinsumDense
from bayes_keras.layers.lora_embedding import LoRAEmbedding


def _lora_scales(model):
    """lora_alpha / rank of every LoRA layer, in the model's order: factors trained at one scale mean something
    else at another."""
    return np.array(
        [
            layer.scale
            for layer in model._flatten_layers()
            if isinstance(layer, (LoRAEinsumDense, LoRAEmbedding))
        ]
    )


def save_adapters(model, filepath):
    """Write `model`'s trainable weights (each by its path) to `filepath` (.npz), in one atomic step: for a
    `bayesianize(..., lora_rank=r)` model, the rank-r factors of every particle and the head, a small fraction
    of the model. Returns the path.

    Example:
        >>> bayes_keras.save_adapters(model, "adapters.npz")
        >>> fresh = bayes_keras.bayesianize(pretrained, num_particles=8, lora_rank=4)   # the same conversion
        >>> bayes_keras.load_adapters(fresh, "adapters.npz")
    """
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"save_adapters: model must be a keras.Model; got {type(model).__name__} {model!r:.80}."
        )
    if not isinstance(filepath, (str, os.PathLike)):
        raise ValueError(
            f"save_adapters: filepath must be a path ending in .npz; got {filepath!r}."
        )
    filepath = os.fspath(filepath)
    if not filepath.endswith(".npz"):
        raise ValueError(
            f"save_adapters writes a .npz file: filepath must end in .npz; got {filepath!r}."
        )
    variables = model.trainable_variables
    if not variables:
        raise ValueError(f"save_adapters: '{model.name}' has no trainable weights.")
    # in the model's order (paths can differ between two conversions in one process: Keras numbers layer names)
    values = {f"{i:05d}": v.numpy() for i, v in enumerate(variables)}
    values["paths"] = np.array([v.path for v in variables])
    values["lora_scales"] = _lora_scales(model)
    return atomic_files.replace_file(
        filepath, lambda temporary: np.savez(temporary, **values), suffix=".npz"
    )


def load_adapters(model, filepath):
    """Set `model`'s trainable weights from a `save_adapters` file, in order and with their shapes (a model
    converted the same way: same layers, rank and number of particles)."""
    if not isinstance(filepath, (str, os.PathLike)):
        raise ValueError(
            f"load_adapters: filepath must be the path of a save_adapters .npz file; got {filepath!r}."
        )
    if not os.path.isfile(filepath):
        raise FileNotFoundError(
            f"load_adapters: filepath {os.fspath(filepath)!r} does not exist (or is not a file)."
        )
    try:
        with np.load(str(filepath), allow_pickle=False) as stored:
            paths = list(stored["paths"])
            values = [stored[f"{i:05d}"] for i in range(len(paths))]
            scales = stored["lora_scales"] if "lora_scales" in stored.files else None
    except (
        ValueError,
        OSError,
        KeyError,
        AttributeError,
        TypeError,
    ) as error:  # not an .npz of save_adapters
        raise ValueError(
            f"load_adapters: filepath {filepath} is not a file written by save_adapters (an .npz of the trainable "
            f"weights and their paths): {type(error).__name__}: {error}"
        ) from None
    variables = model.trainable_variables
    if len(values) != len(variables):
        raise ValueError(
            f"load_adapters: {filepath} holds {len(values)} weights, '{model.name}' trains "
            f"{len(variables)}: convert the model as the saved one was."
        )
    for v, value, path in zip(variables, values, paths):
        if tuple(value.shape) != tuple(v.shape):
            raise ValueError(
                f"load_adapters: {v.path} has shape {tuple(v.shape)} here and {path} "
                f"{tuple(value.shape)} in {filepath} (another rank or number of particles?)."
            )
    here = _lora_scales(model)
    if scales is not None and (scales.shape != here.shape or not np.allclose(scales, here)):
        raise ValueError(
            f"load_adapters: {filepath} holds factors trained at lora_alpha / rank = "
            f"{sorted(set(np.round(scales, 6).tolist()))}, '{model.name}' scales them by "
            f"{sorted(set(np.round(here, 6).tolist()))}: convert the model with the saved one's "
            "lora_alpha."
        )
    for v, value in zip(variables, values):
        v.assign(value)
