"""Initial values of particle weights: N independent draws of a Keras initializer, one per particle."""

import random

import keras
import numpy as np
import tensorflow as tf


def default_bias_initializer(bias_initializer, deterministic):
    """Zeros for shared biases; a small per-particle spread otherwise (a particle cloud that is
    flat along a coordinate stays flat under GPF's affine flow)."""
    if bias_initializer is not None:
        return bias_initializer
    return "zeros" if deterministic else keras.initializers.RandomNormal(stddev=0.01)


def particle_initializer(initializer, num_particles):
    """Initializer for an (N, ...) stack: N independent draws of `initializer` on the per-particle shape.

    Keras' random initializers are drawn for all particles in one call on the stacked shape (a fan-based one,
    Glorot / He / LeCun, with its scale corrected so that the particle axis does not count as a receptive
    field); other initializers with a seed (Orthogonal, Identity, custom ones) particle by particle on the
    per-particle shape. Seeds derive from Python's `random`, which `keras.utils.set_random_seed` seeds.
    """
    initializer = keras.initializers.get(initializer)
    config = initializer.get_config()

    def init(shape, dtype=None):
        per_particle = tuple(shape[1:])
        if "seed" not in config:
            value = initializer(per_particle, dtype=dtype)
            return tf.tile(tf.expand_dims(value, 0), [num_particles] + [1] * len(per_particle))
        base = int(config["seed"] if config["seed"] is not None else random.randint(0, 2**30))
        if isinstance(initializer, _STACKABLE) and type(initializer).__module__.startswith(
            "keras."
        ):
            return _stacked_draw(initializer, config, base, num_particles, per_particle, dtype)
        if num_particles > _LOOP_LIMIT:
            raise ValueError(
                f"{num_particles} particles with the {type(initializer).__name__} initializer would be "
                f"drawn one by one; use at most {_LOOP_LIMIT} particles, or a Keras random / "
                "variance-scaling initializer."
            )
        draws = []
        for i in range(num_particles):
            clone = initializer.__class__.from_config({**config, "seed": base + 7919 * i})
            draws.append(clone(per_particle, dtype=dtype))
        return tf.stack(draws, axis=0)

    return init


# bytes held while a particle weight is drawn, per byte (benchmarks/size_guard_peaks.py)
DRAW_HEADROOM = 3.5
# at most this many particles are drawn one by one (a Python loop of 1e8 draws never ends)
_LOOP_LIMIT = 4096
# Initializers whose draws on the stacked (N, ...) shape are N independent per-particle draws (VarianceScaling
# once its scale is corrected for the fans; Keras' own classes, not subclasses): one call for all particles.
_STACKABLE = (
    keras.initializers.VarianceScaling,
    keras.initializers.RandomNormal,
    keras.initializers.RandomUniform,
    keras.initializers.TruncatedNormal,
)


def _stacked_draw(initializer, config, seed, num_particles, per_particle, dtype):
    """All particles' draws in one call of `initializer` on the stacked shape: exact for initializers whose
    distribution does not depend on the shape; a fan-based one (Glorot, He, LeCun: VarianceScaling) reads
    the particle axis as part of its fans, so its scale is multiplied by stacked fan / per-particle fan, which
    gives every particle the per-particle distribution."""
    stacked = (num_particles,) + per_particle
    if isinstance(initializer, keras.initializers.VarianceScaling):
        fans = [_fan(shape, initializer.mode) for shape in (per_particle, stacked)]
        return keras.initializers.VarianceScaling(
            initializer.scale * fans[1] / fans[0],
            initializer.mode,
            initializer.distribution,
            seed=seed,
        )(stacked, dtype=dtype)
    return initializer.__class__.from_config({**config, "seed": seed})(stacked, dtype=dtype)


def _fan(shape, mode):
    """Keras' fan of a shape for VarianceScaling's `mode` (compute_fans: receptive field x channels)."""
    if len(shape) < 1:
        fan_in = fan_out = 1
    elif len(shape) == 1:
        fan_in = fan_out = shape[0]
    elif len(shape) == 2:
        fan_in, fan_out = shape
    else:
        receptive = int(np.prod(shape[:-2]))
        fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
    return {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode]
