"""apply_if_finite: the training step's guard for an update that has none of its own.

A BayesianOptimizer refuses a non-finite update itself (`BayesianOptimizer.apply`). A plain Keras
optimizer has no such guard, and under float16 loss scaling an overflow of the scaled backward pass (a
finite loss with non-finite gradients) must be told apart from a NaN step: both are decided here, once
for all replicas (as optax's `apply_if_finite` wraps an update).
"""

import tensorflow as tf

from bayes_keras.training import distribute

GROWTH_INTERVAL = 2000  # applied steps in a row after which the float16 loss scale doubles (Keras')


def apply_if_finite(
    apply, grads, loss, skipped, step_finite=None, loss_scale=None, good_steps=None
):
    """Call `apply(grads)` when the loss, every gradient and `step_finite` are finite; returns whether it
    did (a boolean tensor, the same on every replica).

    A refused step changes nothing and counts in `skipped`, except a float16 overflow (`loss_scale`
    given, a finite loss with non-finite gradients): the scale is halved and the next batch retried. The
    scale doubles after GROWTH_INTERVAL applied steps in a row.

    Args:
        apply: called with the gradients (a list, None where a variable has none).
        grads: the step's gradients (this replica's).
        loss: the step's loss.
        skipped: the model's count of skipped steps (an int32 variable).
        step_finite: `StepInfo.finite` of a Bayesian optimizer's step, or None.
        loss_scale, good_steps: the float16 loss scale and its count of applied steps in a row
            (variables), or None.
    """
    finite_loss = tf.math.is_finite(loss)
    finite = finite_loss
    for g in grads:
        if g is not None:
            finite = finite & tf.reduce_all(tf.math.is_finite(g))
    if step_finite is not None:
        finite = finite & step_finite
    # One decision for all replicas (a Keras optimizer's gradients are this replica's own).
    finite = distribute.all_replicas_agree(finite)
    present = [i for i, g in enumerate(grads) if g is not None]

    # What the branches use is passed through (each replica's own tensors, see distribute.guarded).
    def on_finite(finite_loss, *present_grads):
        given = [None] * len(grads)
        for i, g in zip(present, present_grads):
            given[i] = g
        apply(given)

    def on_non_finite(finite_loss, *present_grads):
        if loss_scale is None:
            return  # counted below
        loss_scale.assign(tf.where(finite_loss, loss_scale / 2.0, loss_scale))
        good_steps.assign(0)
        skipped.assign_add(tf.where(finite_loss, 0, 1))

    args = [finite_loss] + [grads[i] for i in present]
    applied = distribute.guarded(finite, on_finite, on_non_finite, args=args)
    # outside the decision: under tf.distribute its branches run in every replica
    if loss_scale is None:
        skipped.assign_add(tf.cast(tf.logical_not(finite), skipped.dtype))
    else:
        good = tf.where(applied, good_steps + 1, 0)
        grow = good >= GROWTH_INTERVAL
        loss_scale.assign(tf.where(grow, loss_scale * 2.0, loss_scale))
        good_steps.assign(tf.where(grow, 0, good))
    return applied
