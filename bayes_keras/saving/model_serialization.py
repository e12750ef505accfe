"""The saving half of BayesianModel: configuration, the .keras format, and export of the predictive.

`ModelSerialization` is a mixin of `BayesianModel` only (as ParticleTrainer is its training half): it
reads the model's likelihood, particle count, dataset size and temperature, which BayesianModel
(bayes_keras/model.py) owns and documents.
"""

import os
import sys

import keras
import numpy as np

# keras.src: how Keras rebuilds a functional model from its config (Functional.from_config's body; no public name)
from keras.src.models.functional import functional_from_config

from bayes_keras.saving import atomic_files
from bayes_keras import likelihoods as likelihoods_lib
from bayes_keras._config import check_number
from bayes_keras.saving.export import export_predictive
from bayes_keras.saving.loaded_state import check_bounded_entry, remembered_refusal


class ModelSerialization:
    """get_config / from_config / save / export / compile_from_config of a BayesianModel."""

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "likelihood": None
                if self.likelihood is None
                else likelihoods_lib.serialize(self.likelihood),
                "num_particles": self._expected_num_particles,
                "dataset_size": self.dataset_size,
                "temperature": self.temperature,
            }
        )
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        own = {
            k: config.pop(k, None)
            for k in ("likelihood", "num_particles", "dataset_size", "temperature")
        }
        if own["temperature"] is None:
            own["temperature"] = 1.0
        if own["likelihood"] is not None:
            own["likelihood"] = likelihoods_lib.get(own["likelihood"])
        if "layers" in config and "input_layers" in config:
            model = functional_from_config(cls, config, custom_objects=custom_objects)
            model.likelihood = own["likelihood"]
            model._expected_num_particles = own["num_particles"]
            model._check_structure()
            model.temperature = check_number(own["temperature"], "temperature")
            if own["dataset_size"] is not None:
                model.set_dataset_size(own["dataset_size"])
            refreeze(model)
            return model
        return cls(**config, **own)

    def load_own_variables(self, store):
        """Keras' loading of the model's own state (the likelihood's noise scale and target standardisation, the
        skipped-step count), then a check that it is state the model could hold: a NaN or out-of-range noise scale, a
        non-positive target scale or a negative count is refused, naming the entry."""
        with remembered_refusal(self, store):
            super().load_own_variables(store)
            if self.likelihood is not None:
                self.likelihood.check_loaded_state(self.name)
            check_bounded_entry(self.name, self._skipped, "model", "skipped steps")

    def get_compile_config(self):
        """Keras' compile config plus the likelihood and temperature, so keras.models.clone_model of a
        compiled model (which builds the clone from inputs and outputs alone, then compiles it from this
        config) keeps them."""
        config = super().get_compile_config()
        # Keras' {} means "not compiled": keep it so on load
        if config and self.likelihood is not None:
            config = {
                **config,
                "likelihood": likelihoods_lib.serialize(self.likelihood),
                "temperature": self.temperature,
            }
        return config

    def compile_from_config(self, config):
        config = keras.saving.deserialize_keras_object(config)
        if self.likelihood is not None:  # a loaded model has its own (with its variables): keep it
            config.pop("likelihood", None)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def save(self, filepath, *args, **kwargs):
        """As keras.Model.save, in the .keras format (particles, likelihood, optimizer state); the legacy
        HDF5 format cannot hold a BayesianModel's configuration and is refused. Atomic: the file is written
        beside `filepath` and renamed over it, so a crash or a full disk leaves the previous file intact."""
        if str(filepath).lower().endswith((".h5", ".hdf5")):
            raise ValueError(
                f"BayesianModel saves in the Keras format: use a path ending in '.keras' (got "
                f"{str(filepath)!r}; the legacy HDF5 format cannot restore a BayesianModel). For "
                "serving, model.export(path) writes a SavedModel of the predictive."
            )
        if not isinstance(filepath, (str, os.PathLike)) or kwargs.get("zipped") is False or args:
            return super().save(filepath, *args, **kwargs)
        # (the temporary file's name would have satisfied Keras' check)
        if not str(filepath).endswith(".keras"):
            raise ValueError(
                f"BayesianModel.save writes the Keras format: filepath must end in '.keras'; got "
                f"{str(filepath)!r} (keras.models.load_model refuses other names). For serving, "
                "model.export(path) writes a SavedModel of the predictive."
            )
        if os.path.isdir(filepath):
            raise ValueError(
                f"BayesianModel.save: filepath {str(filepath)!r} is a directory; give a file path."
            )
        directory = os.path.dirname(os.path.abspath(filepath))
        if not os.path.isdir(directory):
            raise FileNotFoundError(
                f"BayesianModel.save: filepath {str(filepath)!r} is in a directory that does not "
                f"exist ({directory!r}); make it first."
            )
        if not isinstance(kwargs.get("overwrite", True), (bool, np.bool_)):
            raise ValueError(
                f"BayesianModel.save: overwrite must be True or False; got {kwargs['overwrite']!r}."
            )
        if os.path.exists(filepath) and not kwargs.get("overwrite", True):
            # Keras would ask on a terminal, and fail (EOFError) elsewhere
            if not (sys.stdin and sys.stdin.isatty()):
                raise FileExistsError(
                    f"BayesianModel.save: {str(filepath)!r} exists and overwrite=False; pass "
                    "overwrite=True to replace it, or another path."
                )
            return super().save(filepath, **kwargs)  # Keras asks whether to overwrite
        kwargs["overwrite"] = True  # the temporary file is new; the rename replaces the target
        # Written beside the target, then renamed over it: a crash or a full disk leaves the old file or the
        # new one, never a partial one (bayes_keras/saving/atomic_files.py).
        atomic_files.replace_file(
            filepath,
            lambda temporary: super(ModelSerialization, self).save(temporary, **kwargs),
            suffix=".keras",
        )

    def export(
        self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs
    ):
        """As keras.Model.export, but a "tf_saved_model" serves the posterior predictive (class
        probabilities or predictive mean / sd, uncertainty, quantiles, per-particle outputs) without
        bayes_keras: see `bayes_keras.export.export_predictive`. Other formats export the per-particle
        outputs (Keras' own export)."""
        if not isinstance(filepath, (str, os.PathLike)):
            raise ValueError(f"export: filepath must be a directory path; got {filepath!r}.")
        if input_signature is not None and not isinstance(input_signature, (list, tuple, dict)):
            raise ValueError(
                f"export: input_signature must be a list of keras.InputSpec / tf.TensorSpec (one per "
                f"input) or None; got {input_signature!r}."
            )
        if format == "tf_saved_model":
            return export_predictive(
                self,
                filepath,
                input_signature=input_signature,
                verbose=True if verbose is None else verbose,
            )
        try:
            return super().export(
                filepath, format=format, verbose=verbose, input_signature=input_signature, **kwargs
            )
        except ModuleNotFoundError as error:
            raise ValueError(
                f"export: format={format!r} needs the {error.name!r} package, which is not installed "
                "(format='tf_saved_model' needs nothing more)."
            ) from error


def refreeze(model):
    """Set every frozen layer's flag again, down to its sublayers. A layer's config brings its own flag back, but a
    layer that makes its sublayers itself (a KerasHub backbone's TransformerEncoder, a custom layer before the
    particle axis) makes them trainable after that: the reloaded model would train what was frozen, and could not
    load its optimizer's state."""
    for layer in model._flatten_layers(include_self=False):
        if not layer.trainable:
            freeze(layer)


def freeze(layer):
    """`layer.trainable = False`, reaching the sublayers made since the flag was last set: via True, as setting the
    value a layer already has does not reach them (TensorFlow's attribute tracking)."""
    layer.trainable = True
    layer.trainable = False
