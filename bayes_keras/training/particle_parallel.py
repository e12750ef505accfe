"""Particle parallel training: each replica runs the forward and backward pass of its slice of the
particles on the whole batch (docs/distributed.md, "Particle parallel").

`ParticleSlices` holds a copy of the model's architecture with N / R particles (built from the model's
config). In a training step, replica r calls that copy inside a `keras.StatelessScope` that maps each
of its variables to the replica's slice, particles [r N / R, (r + 1) N / R), of the model's variable
(or to the whole variable where it has no particle axis), so the layers compute exactly what the full
model computes for those particles, and the gradients reach the model's own variables. State the
layers write during the pass (BatchNormalization's moving statistics, dropout seed generators) is
collected from the scope, gathered over the replicas along the particle axis, and written to the model.
Every replica still holds all N weight sets (mirrored variables): this splits compute and activation
memory, not weight memory.
"""

import keras
import tensorflow as tf

from bayes_keras.training import distribute


class ParticleSlices:
    """The model's architecture at N / replicas particles, run on slices of the model's variables."""

    def __init__(self, model, replicas):
        n = model.num_particles
        if n % replicas:
            raise ValueError(
                f"parallel='particles' splits the {n} particles evenly over the {replicas} replicas; "
                f"{n} is not a multiple of {replicas}. Use a multiple of {replicas} particles, or "
                "parallel='data'."
            )
        self.num_particles, self.size = n, n // replicas
        try:
            config = model.get_config()
            config["layers"] = [_with_particles(layer, self.size) for layer in config["layers"]]
            config["num_particles"] = self.size
            self.model = type(model).from_config(config)
        except (KeyError, TypeError, NotImplementedError) as error:
            raise ValueError(
                f"parallel='particles' rebuilds the model with {self.size} particles from its config, "
                f"which failed for {type(model).__name__} ({error}). It needs a functional or "
                "Sequential BayesianModel; use parallel='data' for a subclassed one."
            ) from None
        ours, theirs = model.variables, self.model.variables
        if len(ours) != len(theirs):
            raise ValueError(
                f"parallel='particles': the model rebuilt with {self.size} particles has {len(theirs)} "
                f"variables, the model {len(ours)}; use parallel='data'."
            )
        self.pairs = []  # (the copy's variable, the model's, whether it is sliced along the particle axis)
        for mine, full in zip(theirs, ours):
            sliced = tuple(mine.shape) != tuple(full.shape)
            if sliced and (
                tuple(mine.shape) != (self.size,) + tuple(full.shape[1:]) or full.shape[0] != n
            ):
                raise ValueError(
                    f"parallel='particles': variable {full.path} {tuple(full.shape)} does not match "
                    f"{mine.path} {tuple(mine.shape)} of the model rebuilt with {self.size} particles."
                )
            self.pairs.append((mine, full, sliced))
        # Its layers compute replica r's particles [r N / R, (r + 1) N / R) of N: per-particle random draws
        # are made for all N and sliced (bayes_keras.distribute.particle_columns). Nested layers included
        # (an attention's dropout, a Bidirectional's directions): Keras has no public recursive walk, and
        # BayesianModel.particle_layers uses the same one.
        for layer in self.model._flatten_layers(include_self=False):
            layer.particle_slice_of = n

    def __call__(self, x, training=True):
        """This replica's particles' outputs (batch, N / R, ...) on the whole batch `x`."""
        context = tf.distribute.get_replica_context()
        start = tf.cast(context.replica_id_in_sync_group, tf.int32) * self.size
        mapping, given = [], {}
        for mine, full, sliced in self.pairs:
            value = full.value
            if sliced:
                value = tf.slice(
                    value,
                    tf.concat([[start], tf.zeros([len(full.shape) - 1], tf.int32)], 0),
                    [self.size] + list(full.shape[1:]),
                )
            mapping.append((mine, value))
        with keras.StatelessScope(mapping) as scope:
            for mine, value in mapping:
                given[id(mine)] = scope.get_current_value(mine)
            outputs = self.model(x, training=training)
        for (
            mine,
            full,
            sliced,
        ) in self.pairs:  # what the pass wrote (moving statistics, seed generators)
            new = scope.get_current_value(mine)
            if new is given[id(mine)]:
                continue
            full.assign(distribute.gather_examples(new) if sliced else new)
        return outputs


def _with_particles(layer_config, size):
    config = dict(layer_config)
    # built with N particles: the call on the inputs builds it anew
    config.pop("build_config", None)
    inner = dict(config["config"])
    if inner.get("num_particles") is not None:
        inner["num_particles"] = size
    config["config"] = inner
    return config
