"""Step rules against what they are defined to compute (bayes_keras.core.step_rules)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402
from bayes_keras.core import step_rules  # noqa: E402


def _run(rule, directions, learning_rate=0.1):
    state = {k: tf.zeros(s, tf.float64) for k, s in rule.slots(directions[0].shape).items()}
    steps = []
    for t, d in enumerate(directions, start=1):
        step, state = rule.apply(tf.constant(d), state, learning_rate, t)
        steps.append(step.numpy())
    return steps


def test_signal_share_keeps_agreeing_steps_and_shrinks_noise_to_its_theoretical_share():
    """Directions that repeat (full batch, a consistent drift) get the inner rule's step unchanged (share 1
    exactly, from the first step on, by the bias correction). Independent noise directions: the bias-corrected
    running mean of T iid vectors has E|m_hat|^2 = v sum_t w_t^2 with weights w_t = (1 - d) d^(T-t) / (1 - d^T),
    i.e. (1 - d)(1 + d^T) / ((1 + d)(1 - d^T)) -> (1 - d) / (1 + d) = 0.0526 at d = 0.9."""
    rng = np.random.default_rng(0)
    same = rng.standard_normal((8, 50))
    rule = step_rules.SignalShare(step_rules.SGD(), decay=0.9)
    for step in _run(rule, [same] * 30):
        np.testing.assert_allclose(step, 0.1 * same, rtol=1e-12)
    shares = []
    for _ in range(20):
        noise = [rng.standard_normal((8, 500)) for _ in range(200)]
        steps = _run(step_rules.SignalShare(step_rules.SGD(), decay=0.9), noise)
        shares.append(np.sum(steps[-1] * noise[-1]) / np.sum(0.1 * noise[-1] ** 2))
    assert abs(np.mean(shares) - 0.1 / 1.9) < 0.006, np.mean(shares)


def test_signal_share_wraps_any_rule_and_serialises():
    rule = step_rules.get("signal_rmsprop")
    assert isinstance(rule, step_rules.SignalShare) and isinstance(
        rule.rule, step_rules.DimWiseRMSProp
    )
    again = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(
            step_rules.SignalShare(step_rules.DimWiseAdam(beta_1=0.5), decay=0.8)
        )
    )
    assert again.decay == 0.8 and again.rule.beta_1 == 0.5
    with pytest.raises(ValueError, match="SignalShare decay must be in"):
        step_rules.SignalShare(decay=1.0)
    opt = bk.optimizers.GaussianParticleFlow(step_rule="signal_rmsprop")
    assert isinstance(
        bk.optimizers.GaussianParticleFlow.from_config(opt.get_config()).step_rule,
        step_rules.SignalShare,
    )


def test_element_wise_adam_saved_under_its_old_name_loads():
    """ElementwiseAdam was `step_rules.Adam` (registered "bayes_keras.step_rules>Adam"): a config saved
    then deserializes to it, with its settings."""
    saved = {
        "module": "bayes_keras.inference.step_rules",
        "class_name": "Adam",
        "config": {"beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-6},
        "registered_name": "bayes_keras.step_rules>Adam",
    }
    rule = keras.saving.deserialize_keras_object(saved)
    assert type(rule) is bk.step_rules.ElementwiseAdam
    assert (rule.beta_1, rule.beta_2, rule.epsilon) == (0.8, 0.99, 1e-6)
