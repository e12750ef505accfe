"""Learning-rate schedules used by the papers' methods (Keras LearningRateSchedule objects)."""

import keras
import tensorflow as tf

from bayes_keras._config import check_number


@keras.saving.register_keras_serializable(package="bayes_keras")
class ConstantThenInverseTime(keras.optimizers.schedules.LearningRateSchedule):
    """beta_t = beta for t <= tau, then beta * tau / t (MGVBP's schedule; t counts steps from 1).

    Constant steps move q quickly to the optimum; the 1/t tail averages out the Monte Carlo noise of
    the gradient estimates (a Robbins-Monro condition), so the state converges instead of jittering.

    Example:
        >>> opt = bayes_keras.optimizers.MGVBP(ConstantThenInverseTime(0.05, tau=500))
    """

    def __init__(self, initial_learning_rate, tau):
        initial_learning_rate = check_number(initial_learning_rate, "initial_learning_rate")
        tau = check_number(tau, "tau (steps of constant learning rate)")
        if not initial_learning_rate > 0:
            raise ValueError(
                f"initial_learning_rate must be positive; got {initial_learning_rate!r}."
            )
        if not tau >= 1:
            raise ValueError(f"tau must be >= 1 (steps of constant learning rate); got {tau!r}.")
        self.initial_learning_rate = float(initial_learning_rate)
        self.tau = int(tau)

    def __call__(self, step):
        t = tf.cast(step, tf.float32) + 1.0
        return self.initial_learning_rate * tf.minimum(1.0, float(self.tau) / t)

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate, "tau": self.tau}
