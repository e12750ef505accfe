"""The predicting half of BayesianModel: predict's step and the posterior predictive (per-particle outputs,
the predictive distribution, the uncertainty decomposition).

`ParticlePredictor` is a mixin of `BayesianModel` only: it reads the model's likelihood and loss dtype. The
compiled per-particle forward passes are kept off the model (`particle_function`), so threads may predict on
one model at once.
"""

import threading
import weakref

import keras
import numpy as np
import tensorflow as tf

# keras.src: predict's own iteration over arrays, datasets and generators (no public data-adapter API)
from keras.src.trainers import data_adapters

from bayes_keras.training import call_checks


class ParticlePredictor:
    """predict_step, predict_particles, predictive and uncertainty of a model over N weight sets."""

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        outputs = tf.cast(self(x, training=False), self.loss_dtype)
        self._build_likelihood(outputs.shape)
        return self.likelihood.summary(outputs)

    # -- posterior predictive ------------------------------------------------------------------
    def predict_particles(self, x, batch_size=None, verbose=0, steps=None):
        """Per-particle outputs (batch, N, ...) as a numpy array, for the inputs `predict` takes (arrays, a
        tf.data.Dataset, a PyDataset or generator; `steps` as in predict). It keeps no per-call state on the
        model, so threads may call it, `predict`, `predictive` and `uncertainty` on one model at once."""
        if x is None:
            raise ValueError(
                "predict_particles needs inputs x (arrays, a tf.data.Dataset, a PyDataset or a "
                "generator); got None."
            )
        call_checks.batch_size(batch_size)
        call_checks.not_empty(x, "predict_particles")
        call_checks.inputs(self, x, "predict_particles")
        call_checks.steps(x, steps, "predict_particles")
        adapter = data_adapters.get_data_adapter(
            x,
            batch_size=batch_size or (None if _is_batched(x) else 32),
            steps_per_epoch=steps,
            shuffle=False,
        )
        function = particle_function(self, count_non_finite=True)
        outputs, non_finite = [], 0
        for step, batch in enumerate(adapter.get_tf_dataset()):
            if steps is not None and step >= steps:
                break
            inputs, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
            batch_outputs, batch_non_finite = function(inputs)
            outputs.append(batch_outputs.numpy())
            non_finite += int(batch_non_finite)
        if not outputs:
            raise ValueError("predict_particles got no examples (an empty x or dataset).")
        call_checks.warn_non_finite(non_finite, "predict_particles")
        return np.concatenate(outputs, axis=0)

    def predictive(self, x, batch_size=None):
        """The posterior predictive p(y | x, D) as a TFP distribution with batch shape (batch,)."""
        outputs = tf.convert_to_tensor(self.predict_particles(x, batch_size=batch_size))
        self._build_likelihood(outputs.shape)
        return self.likelihood.predictive(outputs)

    def uncertainty(self, x, batch_size=None):
        """Uncertainty decomposition per example (numpy arrays).

        Classification: total_entropy = expected_entropy (aleatoric) + mutual_information (epistemic).
        Regression: total_variance = aleatoric_variance + epistemic_variance.
        """
        outputs = tf.convert_to_tensor(self.predict_particles(x, batch_size=batch_size))
        self._build_likelihood(outputs.shape)
        return {k: v.numpy() for k, v in self.likelihood.uncertainty(outputs).items()}


# model -> {training: its compiled per-particle forward pass}
_PARTICLE_FUNCTIONS = weakref.WeakKeyDictionary()
_PARTICLE_FUNCTIONS_LOCK = threading.Lock()


def particle_function(model, training=False, count_non_finite=False):
    """The model's compiled forward pass (batch, N, ...) in inference mode (or training mode, whose
    BatchNormalization layers update their moving statistics), made once per model and mode (kept off the
    model, whose attributes Keras tracks and exports). With `count_non_finite` it returns (outputs, the number
    of NaN / Inf input values), counted in the same graph."""
    with _PARTICLE_FUNCTIONS_LOCK:
        functions = _PARTICLE_FUNCTIONS.setdefault(model, {})
        function = functions.get((training, count_non_finite))
        if function is None:
            owner = weakref.ref(model)

            def particle_outputs(inputs):
                bound = owner()
                outputs = tf.cast(bound(inputs, training=training), bound.loss_dtype)
                return (
                    (outputs, call_checks.count_non_finite(inputs)) if count_non_finite else outputs
                )

            function = functions[(training, count_non_finite)] = tf.function(
                particle_outputs, reduce_retracing=True
            )
    return function


def _is_batched(x):
    """Inputs that come in batches already (no batch_size applies): datasets, PyDatasets, generators."""
    return isinstance(x, (tf.data.Dataset, keras.utils.PyDataset)) or hasattr(x, "__next__")
