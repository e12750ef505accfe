"""Size guards: refuse, with the estimate, an allocation that cannot fit this machine's memory, before
anything is built (a tensor larger than memory otherwise fails deep inside TensorFlow, e.g. "Cannot parse
tensor from proto", or swaps the machine to a halt)."""

import os

import numpy as np


def physical_memory_bytes():
    """Total physical memory of this machine in bytes (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def format_bytes(nbytes):
    for unit, size in (("TB", 2**40), ("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} bytes"


def check_fits(nbytes, what, remedy, limit=None):
    """Raise a ValueError naming `what`, its estimated size and `remedy` when `nbytes` exceeds `limit` (default:
    this machine's physical memory)."""
    limit = physical_memory_bytes() if limit is None else limit
    if limit is not None and nbytes > limit:
        raise ValueError(
            f"{what} would need about {format_bytes(nbytes)}, more than this machine's "
            f"{format_bytes(limit)} of memory. {remedy}"
        )


def tensor_bytes(shape, dtype="float32"):
    return float(np.prod([float(d) for d in shape])) * np.dtype(dtype).itemsize


def check_training_step_fits(method, particle_variables, step_headroom, pairwise_tensors):
    """Refuse a training step of `method` on these (N, ...) particle variables that cannot fit this machine's
    memory: `step_headroom` times the particle weights (the weights, the optimizer's state, the gradients
    and the update's temporaries) plus `pairwise_tensors` N x N tensors. Activations come on top."""
    if not particle_variables:
        return
    n, dtype = int(particle_variables[0].shape[0]), particle_variables[0].dtype
    weights = sum(tensor_bytes(v.shape, v.dtype) for v in particle_variables)
    pairwise = pairwise_tensors * tensor_bytes((n, n), dtype)
    check_fits(
        step_headroom * weights + pairwise,
        f"{method}: a training step with {n} particles ({format_bytes(weights)} of particle "
        f"weights; {step_headroom}x for the optimizer state, gradients and the update"
        + (
            f", and {pairwise_tensors} N x N tensors of {format_bytes(tensor_bytes((n, n), dtype))}"
            if pairwise
            else ""
        )
        + ")",
        "Use fewer particles"
        + (" (this method's kernel grows as N^2)" if pairwise else "")
        + " or a smaller network.",
    )
