"""The training step's guard for updates without one of their own (a plain Keras optimizer, float16 loss
scaling), against Keras' LossScaleOptimizer schedule: halve the scale on an overflow (a finite loss with a
non-finite gradient) without counting a skipped step, count a non-finite loss, double the scale after
2000 applied steps in a row."""

import numpy as np
import pytest
import tensorflow as tf

from bayes_keras.training.apply_if_finite import GROWTH_INTERVAL, apply_if_finite


class _State:
    def __init__(self, scaled, good=0):
        self.applied = tf.Variable(0.0)  # the sum of the gradients apply was given
        self.skipped = tf.Variable(0, dtype=tf.int32)
        self.scale = tf.Variable(2.0**15) if scaled else None
        self.good = tf.Variable(good, dtype=tf.int32) if scaled else None

    def step(self, grads, loss, step_finite=None):
        def apply(given):
            assert given[1] is None  # a variable without a gradient keeps None
            self.applied.assign_add(tf.reduce_sum(given[0]))

        return apply_if_finite(apply, grads, loss, self.skipped, step_finite, self.scale, self.good)


@pytest.mark.parametrize("compiled", [False, True])
def test_float16_loss_scale_follows_keras_schedule(compiled):
    s = _State(scaled=True)
    step = tf.function(s.step) if compiled else s.step
    nan = float("nan")
    assert bool(step([tf.constant([1.0, 2.0]), None], tf.constant(1.0)))
    assert float(s.applied.numpy()) == 3.0 and int(s.good.numpy()) == 1
    # overflow: finite loss, non-finite gradient -> skipped, scale halved, not counted
    assert not bool(step([tf.constant([nan, 2.0]), None], tf.constant(1.0)))
    assert float(s.scale.numpy()) == 2.0**14 and int(s.good.numpy()) == 0
    assert int(s.skipped.numpy()) == 0 and float(s.applied.numpy()) == 3.0
    # a non-finite loss is a skipped step; the scale stays
    assert not bool(step([tf.constant([1.0, 2.0]), None], tf.constant(nan)))
    assert float(s.scale.numpy()) == 2.0**14 and int(s.skipped.numpy()) == 1
    # the Bayesian optimizer's own finiteness (curvature records) refuses the step too
    assert not bool(step([tf.constant([1.0, 2.0]), None], tf.constant(1.0), tf.constant(False)))
    assert float(s.applied.numpy()) == 3.0


def test_scale_doubles_after_the_growth_interval():
    s = _State(scaled=True, good=GROWTH_INTERVAL - 2)
    s.step([tf.constant([1.0]), None], tf.constant(1.0))
    assert float(s.scale.numpy()) == 2.0**15 and int(s.good.numpy()) == GROWTH_INTERVAL - 1
    s.step([tf.constant([1.0]), None], tf.constant(1.0))
    assert float(s.scale.numpy()) == 2.0**16 and int(s.good.numpy()) == 0
    assert GROWTH_INTERVAL == 2000  # Keras' LossScaleOptimizer(dynamic_growth_steps=2000)


def test_without_loss_scale_every_refusal_counts():
    s = _State(scaled=False)
    assert bool(s.step([tf.constant([1.0, 1.0]), None], tf.constant(0.5)))
    assert not bool(s.step([tf.constant([np.inf, 1.0]), None], tf.constant(0.5)))
    assert not bool(s.step([tf.constant([1.0, 1.0]), None], tf.constant(np.inf)))
    assert int(s.skipped.numpy()) == 2 and float(s.applied.numpy()) == 2.0
