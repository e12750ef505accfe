"""PredictiveNegativeLogLikelihood: -log of the posterior predictive density, per example."""

import keras

from bayes_keras.metrics.particle_metric import ParticleMetric


@keras.saving.register_keras_serializable(package="bayes_keras")
class PredictiveNegativeLogLikelihood(ParticleMetric):
    """-log p(y | x, D) with p(y | x, D) = (1/N) sum_n p(y | x, w_n), the particle-averaged density:
    the held-out score a Bayesian model is judged by (nats per example; lower is better).

    Every BayesianModel reports it as "nll" (training, evaluate, and "val_nll" in fit); it can also be
    constructed for a custom loop or under another name.

    Example:
        >>> nll = bayes_keras.metrics.PredictiveNegativeLogLikelihood()
        >>> nll.update_state(y, model.predict_particles(x), model.likelihood)
        >>> float(nll.result())
    """

    direction = "down"

    def __init__(self, name="nll", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def values(self, y_true, particle_outputs, likelihood):
        return -likelihood.predictive_log_prob(y_true, particle_outputs)
