"""ParticleView: the particle variables an optimizer updates, as every method sees them.

Built once, by `BayesianOptimizer.build`, from the variables the optimizer is handed (by
`BayesianModel.fit`, a custom training loop, or `bayes_keras.run_particles`): whoever
built the optimizer, it sees the same layers, priors and partitions. Each particle variable carries
`variable.particle_term` (set by `ParticleLayer.add_particle_weight`): its layer, prior and fan-in.
Variables without one (the functional door's single (N, D) variable) form their own block.

The view holds the model's variables in a plain object, not in a list attribute of the optimizer:
Keras tracks lists of variables assigned to an optimizer, and saved them a second time (the
optimizer's copy then overrode the model's weights on load).
"""

import numpy as np
import tensorflow as tf

PARTITIONS = ("joint", "layer", "variable")


def is_particle_variable(variable):
    return bool(getattr(variable, "is_particle_variable", False))


def merged(blocks):
    """One block of all the indices in `blocks` (a "joint" partition built from any partition)."""
    return [sorted(i for block in blocks for i in block)]


class ParticleView:
    """The particle variables of a model in the optimizer's order.

    Attributes:
        all_variables: every variable the optimizer was built with (particle and shared), in order.
        variables: the (N, ...) particle variables.
        num_particles: N.
        shapes: per-particle shapes; sizes: their flattened sizes d_v.
        layers: the layer owning each variable (None when it has no layer).
        priors: (prior, fan_in) of each variable (None when it has no layer).
        layer_blocks: the "layer" partition: one block per layer, in order of first appearance.

    One vocabulary for every method's structure: a block is a list of indices into `variables`, a
    partition a list of blocks: "joint" (one block over all particle variables), "layer" (one per layer)
    and "variable" (one per variable). (A block's own name in a method says what it is for: a kernel's
    blocks, q's blocks, a preconditioner's blocks.)
    """

    def __init__(self, variables):
        self.all_variables = list(variables)
        self._position = {id(v): i for i, v in enumerate(self.all_variables)}
        self.variables = [v for v in self.all_variables if is_particle_variable(v)]
        if self.variables:
            counts = {int(v.shape[0]) for v in self.variables}
            if len(counts) > 1:
                raise ValueError(
                    f"The particle variables disagree on the number of particles: {sorted(counts)}."
                )
            self.num_particles = counts.pop()
        else:
            self.num_particles = None
        self.shapes = [tuple(int(d) for d in v.shape[1:]) for v in self.variables]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        terms = [getattr(v, "particle_term", None) for v in self.variables]
        self.layers = [None if t is None else t.layer() for t in terms]
        self.priors = [None if t is None else (t.prior, t.fan_in) for t in terms]
        self.layer_blocks = []
        owner = {}
        for i, layer in enumerate(self.layers):
            if layer is None:
                self.layer_blocks.append([i])
            elif id(layer) in owner:
                self.layer_blocks[owner[id(layer)]].append(i)
            else:
                owner[id(layer)] = len(self.layer_blocks)
                self.layer_blocks.append([i])
        self._index = {id(v): i for i, v in enumerate(self.variables)}

    def __len__(self):
        return len(self.variables)

    @property
    def has_layers(self):
        """Whether every particle variable belongs to a bayes_keras particle layer."""
        return all(layer is not None for layer in self.layers)

    def position(self, variable):
        """Position of `variable` in `all_variables`, or None."""
        return self._position.get(id(variable))

    def index(self, variable):
        """Position of `variable` in the view, or None when it is not one of its particle variables."""
        return self._index.get(id(variable))

    def flat_particles(self):
        """The particle variables' current values as (N, d_v) tensors, in view order."""
        return self.flatten([v.value for v in self.variables])

    def flat_gradients(self, grads):
        """Gradients of the particle variables (view order) as (N, d_v) tensors, each in its variable's dtype."""
        return self.flatten([tf.cast(g, v.dtype) for g, v in zip(grads, self.variables)])

    def split_gradients(self, grads, variables):
        """(particle_grads, shared): the gradients of the particle variables in view order (a zero one for a
        particle variable that does not reach the loss, or when no variables are given), and the
        (gradient, variable) pairs of the shared variables."""
        particle_grads = [None] * len(self.variables)
        shared = []
        for g, v in zip(grads, variables):
            i = self.index(v)
            if i is None:
                shared.append((g, v))
            else:
                particle_grads[i] = g
        particle_grads = [
            tf.zeros_like(v) if g is None else g for g, v in zip(particle_grads, self.variables)
        ]
        return particle_grads, shared

    def partition(self, scope):
        """Index lists for `scope` in PARTITIONS."""
        if scope == "joint":
            return [list(range(len(self.variables)))] if self.variables else []
        if scope == "layer":
            return [list(g) for g in self.layer_blocks]
        if scope == "variable":
            return [[i] for i in range(len(self.variables))]
        raise ValueError(f"Unknown partition {scope!r}; expected one of {PARTITIONS}.")

    def flatten(self, tensors, dtype=None):
        """Per-variable (N, ...) tensors -> per-variable (N, d_v) tensors (cast to `dtype` if given)."""
        n = self.num_particles
        out = [tf.reshape(t, (n, -1)) for t in tensors]
        return out if dtype is None else [tf.cast(t, dtype) for t in out]

    def concat(self, flat, block):
        """Per-variable (rows, d_v) tensors -> one (rows, sum_{v in block} d_v) tensor."""
        return flat[block[0]] if len(block) == 1 else tf.concat([flat[i] for i in block], axis=-1)

    def split(self, tensor, block):
        """Inverse of `concat`: a (rows, D_b) tensor (static rows) -> {index: (rows, *shape_i)} for the block's variables."""
        pieces = (
            tf.split(tensor, [self.sizes[i] for i in block], axis=-1)
            if len(block) > 1
            else [tensor]
        )
        rows = tensor.shape[0]
        return {i: tf.reshape(p, (rows,) + self.shapes[i]) for i, p in zip(block, pieces)}
