"""ModelMetrics: the metrics a BayesianModel reports besides Keras' loss and compiled metrics."""

import keras

# keras.src: Keras' callbacks find a monitored metric only in its own MetricsList class (see below)
from keras.src.trainers.compile_utils import MetricsList

from bayes_keras.metrics.particle_metric import ParticleMetric
from bayes_keras.metrics.predictive_negative_log_likelihood import PredictiveNegativeLogLikelihood

METHOD_METRICS = ("free_energy", "elbo")  # what a BayesianOptimizer may list in `reported_metrics`


class ModelMetrics(MetricsList):
    """The predictive NLL ("nll"), the user's ParticleMetrics, and the optimizer's own training metrics
    ("free_energy" / "elbo", per training example), as one group in `model.metrics`.

    A keras MetricsList (a Keras-internal class), because Keras' callbacks look for a monitored metric's
    direction (mode="auto" in EarlyStopping / ModelCheckpoint) only inside such groups
    (docs/architecture.md, "Metrics").
    """

    def __init__(self):
        self.nll = PredictiveNegativeLogLikelihood(name="nll")
        self.method = {name: _TrainingMean(name) for name in METHOD_METRICS}
        self.particle_metrics = []
        self.reported_method_metrics = ()
        super().__init__([self.nll], name="bayesian_metrics")

    def configure(self, particle_metrics, reported_method_metrics):
        """Set the group at compile: the user's ParticleMetrics and the optimizer's reported metrics."""
        unknown = set(reported_method_metrics) - set(self.method)
        if unknown:
            raise ValueError(
                f"The optimizer reports metrics {sorted(unknown)}; BayesianModel tracks "
                f"{sorted(self.method)}."
            )
        names = ["nll"] + [m.name for m in particle_metrics] + list(reported_method_metrics)
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"Metric names must be unique; {duplicates} appear more than once (BayesianModel "
                "always reports 'nll'; name your metric differently)."
            )
        self.particle_metrics = list(particle_metrics)
        self.reported_method_metrics = tuple(reported_method_metrics)
        self.metrics = (
            [self.nll]
            + self.particle_metrics
            + [self.method[n] for n in self.reported_method_metrics]
        )

    def update_predictive(self, y, outputs, likelihood, sample_weight):
        """Update nll and the ParticleMetrics from per-particle outputs (batch, N, ...)."""
        for m in [self.nll] + self.particle_metrics:
            m.update_state(y, outputs, likelihood, sample_weight=sample_weight)

    def update_method(self, reported, batch_size):
        """Update the optimizer's metrics from its `report(step)` dict (training steps only)."""
        for name, value in reported.items():
            self.method[name].update_state(value, sample_weight=batch_size)

    def result(self):
        return {m.name: m.result() for m in self.metrics}

    def evaluation_names(self):
        """What evaluate() reports from this group, in the order it reports them (sorted, as Keras orders
        log entries it does not find in `model.metrics`)."""
        return sorted(m.name for m in [self.nll] + self.particle_metrics)


def split_metrics(metrics, likelihood):
    """(Keras metrics, ParticleMetrics) from compile's `metrics` list, with "accuracy" / "acc" resolved
    by the likelihood (Keras resolves them from a loss or output shapes, which a Bernoulli model's
    (batch,) probabilities mislead)."""
    if metrics is None:
        return None, []
    if isinstance(metrics, dict):
        if any(isinstance(m, ParticleMetric) for m in keras.tree.flatten(metrics)):
            raise ValueError(
                "ParticleMetrics go in a flat list: compile(metrics=[...]); BayesianModel has one output."
            )
        return metrics, []
    single = not isinstance(metrics, (list, tuple))
    keras_metrics, particle_metrics = [], []
    for m in [metrics] if single else metrics:
        if isinstance(m, ParticleMetric):
            particle_metrics.append(m)
        elif isinstance(m, str) and m.lower() in ("accuracy", "acc") and likelihood is not None:
            keras_metrics.append(likelihood.accuracy_metric(m))
        else:
            keras_metrics.append(m)
    return keras_metrics, particle_metrics


class _TrainingMean(keras.metrics.Mean):
    """An optimizer's per-step lower bound / free energy, averaged over the epoch's examples."""

    def __init__(self, name):
        super().__init__(name=name)
        # read by Keras' callbacks for mode="auto"
        self._direction = "up" if name == "elbo" else "down"
