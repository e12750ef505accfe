"""Placing a model's particles around given weights (e.g. a trained deterministic network)."""

import numpy as np


def initialize_particles(particle_layers, center, noise_std=0.1, seed=None):
    """Set every particle of `particle_layers` to `center` plus N(0, noise_std^2) noise.

    Args:
        particle_layers: the model's particle layers, in the order of its weights
            (`BayesianModel.particle_layers`).
        center: a Keras model of the same architecture with ordinary layers, or a list of arrays in
            layer order (kernel, bias per layer). Shared (deterministic) weights are set to it exactly.
        noise_std: standard deviation of the per-particle Gaussian jitter.
        seed: seed of the jitter (numpy's default_rng).
    """
    arrays = center.get_weights() if hasattr(center, "get_weights") else list(center)
    rng = np.random.default_rng(seed)
    terms = [t for layer in particle_layers for t in layer.prior_terms]
    if len(arrays) != len(terms):
        raise ValueError(f"initialize_particles: expected {len(terms)} arrays (kernel/bias per layer), "
                         f"got {len(arrays)}.")
    for (variable, _, _), a in zip(terms, arrays):
        a = np.asarray(a, dtype=np.float32)
        if getattr(variable, "is_particle_variable", False):
            if tuple(a.shape) != tuple(variable.shape[1:]):
                raise ValueError(f"initialize_particles: {variable.path} needs per-particle shape "
                                 f"{tuple(variable.shape[1:])}, got {a.shape}.")
            value = a[None] + noise_std * rng.standard_normal(tuple(variable.shape)).astype(np.float32)
        else:
            if tuple(a.shape) != tuple(variable.shape):
                raise ValueError(f"initialize_particles: {variable.path} needs shape {tuple(variable.shape)}, "
                                 f"got {a.shape}.")
            value = a
        variable.assign(value)
