"""MGVBP's curvature targets from the layers' captured statistics, and the priors they are damped with.

With curvature="empirical_fisher" / "fisher" the precision moves toward the data's Fisher plus the prior
precision / T instead of the Stein estimate: per weight (structure="diagonal", `fisher_diagonal`) or as
KFAC's Kronecker factors of each Dense / Conv layer (structure="kronecker", `kronecker_targets`, whose
block shapes `kronecker_shapes` checks). The score estimator reads the Normal priors (`prior_vectors`).
"""

import tensorflow as tf

from bayes_keras.curvature.diagonal import per_example_squared_gradients
from bayes_keras.curvature.kfac import candidate_specs, kfac_factors
from bayes_keras.optimizers.gaussian_vi import natural_gradients as ng
from bayes_keras.priors import Normal


def kronecker_shapes(view, blocks, max_block_size):
    """Each block is one Dense / Conv2D layer's [kernel; bias] as a (p, q) matrix (KFAC's view)."""
    shapes = []
    for g in blocks:
        group = [view.variables[i] for i in g]
        names = ", ".join(v.path for v in group)
        try:
            spec = candidate_specs(group)[0]
        except ValueError as error:
            raise ValueError(
                f"MGVBP structure='kronecker' needs Dense, Conv1D or Conv2D particle layers; [{names}]: "
                f"{error} Use structure='diagonal' for this model."
            ) from None
        if not spec.kernel_and_bias:
            raise ValueError(
                f"MGVBP structure='kronecker' supports Dense, Conv1D and Conv2D particle layers; [{names}] "
                f"is a {spec.kind}. Use structure='diagonal' for this model."
            )
        if spec.variables != group:  # the flat block must be [kernel, bias], KFAC's row order
            raise ValueError(
                f"MGVBP structure='kronecker': expected the variables of [{names}] in the order "
                f"{[v.path for v in spec.variables]}."
            )
        p, q = spec.block_shape(spec.blocks[0])
        if max(p, q) > max_block_size:
            raise ValueError(
                f"MGVBP structure='kronecker' needs a {max(p, q)} x {max(p, q)} factor for "
                f"[{names}], above max_block_size={max_block_size}. Use "
                "structure='diagonal', or raise max_block_size."
            )
        shapes.append((p, q))
    return shapes


def prior_vectors(view, block, dtype, user):
    """(mean, precision) vectors of the layers' Normal priors over a block's coordinates."""
    means, precisions = [], []
    for i in block:
        if view.priors[i] is None:
            raise ValueError(
                f"MGVBP {user} needs the layers' priors; {view.variables[i].path} belongs to no "
                "bayes_keras particle layer."
            )
        prior, fan_in = view.priors[i]
        if not isinstance(prior, Normal):
            raise ValueError(
                f"MGVBP {user} handles Normal priors in closed form; {view.variables[i].path} has "
                f"{prior!r}. Use estimator='score_h', or estimator='gradient' with curvature='stein'."
            )
        sd = prior.stddev(fan_in)
        means.append(tf.fill((view.sizes[i],), tf.constant(prior.loc, dtype)))
        precisions.append(tf.fill((view.sizes[i],), tf.constant(1.0 / sd**2, dtype)))
    return tf.concat(means, 0), tf.concat(precisions, 0)


def fisher_diagonal(view, block, records, curvature, dtype):
    """Tempered, data-set-scaled empirical (or sampled-label) Fisher diagonal over a block's coordinates,
    E_q by the mean over the N samples."""
    labels = "sampled" if curvature == "fisher" else "observed"
    fisher = {}
    for r in records:
        if getattr(
            r.layer, "deterministic", False
        ):  # shared weights: a point estimate, no q to curve
            continue
        for variable, squares in per_example_squared_gradients(r, labels):
            flat = tf.reshape(tf.cast(squares, dtype), (view.num_particles, -1))
            fisher[view.index(variable)] = tf.cast(r.dataset_scale, dtype) * tf.reduce_mean(flat, 0)
    pieces = []
    for i in block:
        if i not in fisher:
            raise ValueError(
                f"MGVBP curvature={curvature!r}: no curvature was captured for {view.variables[i].path} "
                "(supported: Dense, Conv2D, Embedding and BatchNormalization particle layers)."
            )
        pieces.append(fisher[i])
    return pieces[0] if len(pieces) == 1 else tf.concat(pieces, 0)


def tempered_prior_precision(view, block, step, curvature, dtype):
    """The Normal priors' precisions over a block's coordinates divided by the posterior temperature
    (the part of the Fisher curvatures' target that the data does not give)."""
    precision = prior_vectors(view, block, dtype, f"curvature='{curvature}'")[1]
    return precision / tf.cast(step.temperature, dtype)


def kronecker_targets(view, blocks, kron_index, records, curvature, temperature, dtype):
    """Per block, the damped KFAC factors (A_hat, G_hat) that P moves toward: this batch's factors
    (dataset scale and temperature in G), E_q by the mean over the samples, with the prior precision
    / T of each row (kernel rows, bias row) as the damping D in A (x) G + D (x) I."""
    fisher = "true" if curvature == "fisher" else "empirical"
    targets = [None] * len(blocks)
    for r in records:
        j = kron_index.get(view.index(r.layer.kernel))
        if j is None:
            continue
        factors = kfac_factors(r, fisher)
        a = tf.reduce_mean(tf.cast(factors["A"], dtype), 0)
        g = tf.reduce_mean(tf.cast(factors["G"], dtype), 0)
        prior = prior_vectors(view, blocks[j], dtype, f"curvature='{curvature}'")[1] / tf.cast(
            temperature, dtype
        )
        # each row's prior precision: the block is [kernel rows; bias row] x outputs, flattened row-major
        rows = tf.reshape(prior, (a.shape[-1], g.shape[-1]))[:, 0]
        targets[j] = ng.damped_kronecker_factors(a, g, rows)
    for j, t in enumerate(targets):
        if t is None:
            raise ValueError(
                f"MGVBP structure='kronecker': no curvature was captured for "
                f"{view.variables[blocks[j][0]].path}."
            )
    return targets
