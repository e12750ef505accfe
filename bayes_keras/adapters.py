"""The trained part of a fine-tuned model alone: save and load a BayesianModel's trainable weights (a LoRA model's
factors and its head's particles) without the frozen weights they adapt."""

import numpy as np

from bayes_keras import atomic_files


def save_adapters(model, filepath):
    """Write `model`'s trainable weights (each by its path) to `filepath` (.npz), in one atomic step: for a
    `bayesianize(..., lora_rank=r)` model, the rank-r factors of every particle and the head, a small fraction
    of the model. Returns the path.

    Example:
        >>> bayes_keras.save_adapters(model, "adapters.npz")
        >>> fresh = bayes_keras.bayesianize(pretrained, num_particles=8, lora_rank=4)   # the same conversion
        >>> bayes_keras.load_adapters(fresh, "adapters.npz")
    """
    filepath = str(filepath)
    if not filepath.endswith(".npz"):
        raise ValueError(f"save_adapters writes a .npz file; got {filepath!r}.")
    variables = model.trainable_variables
    if not variables:
        raise ValueError(f"save_adapters: '{model.name}' has no trainable weights.")
    # in the model's order (paths can differ between two conversions in one process: Keras numbers layer names)
    values = {f"{i:05d}": v.numpy() for i, v in enumerate(variables)}
    values["paths"] = np.array([v.path for v in variables])
    return atomic_files.replace_file(filepath, lambda temporary: np.savez(temporary, **values), suffix=".npz")


def load_adapters(model, filepath):
    """Set `model`'s trainable weights from a `save_adapters` file, in order and with their shapes (a model
    converted the same way: same layers, rank and number of particles)."""
    with np.load(str(filepath)) as stored:
        paths = list(stored["paths"])
        values = [stored[f"{i:05d}"] for i in range(len(paths))]
    variables = model.trainable_variables
    if len(values) != len(variables):
        raise ValueError(f"load_adapters: {filepath} holds {len(values)} weights, '{model.name}' trains "
                         f"{len(variables)}: convert the model as the saved one was.")
    for v, value, path in zip(variables, values, paths):
        if tuple(value.shape) != tuple(v.shape):
            raise ValueError(f"load_adapters: {v.path} has shape {tuple(v.shape)} here and {path} "
                             f"{tuple(value.shape)} in {filepath} (another rank or number of particles?).")
    for v, value in zip(variables, values):
        v.assign(value)
