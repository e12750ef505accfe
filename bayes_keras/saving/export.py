"""Export a BayesianModel's posterior predictive as a TensorFlow SavedModel that serves without bayes_keras.

The SavedModel holds the particle weights and the likelihood's constants as variables and the predictive
computations as TensorFlow graphs, so `tf.saved_model.load(path)` (or TF-Serving) serves it in a process
where bayes_keras is not installed.

An export over an existing one is written beside it and swapped in: after a crash the path holds the old
or the new export, or, if it is missing, `bayes_keras.saving.atomic_files.backups(path)[0]` holds the old one. An
existing directory that is not an export (a SavedModel) is refused, not replaced.

Endpoints (each takes the model's input batch `inputs`; documented in `export_predictive`):
    serving_default / serve   everything below except particle_outputs and quantiles, as one dict
    predictive                what `model.predict` returns: "probabilities", or "mean" and "std"
    uncertainty               what `model.uncertainty` returns (entropies, or variances)
    particle_outputs          the per-particle outputs (batch, N, ...): logits or means
    quantiles                 (regression) quantiles of the predictive mixture at `levels` (batch, L, d)
"""

import keras
import tensorflow as tf

# keras.src: Keras' message printer, which follows keras.config.disable_interactive_logging (no public one)
from keras.src.utils import io_utils

from bayes_keras.saving import atomic_files


def export_predictive(model, filepath, input_signature=None, verbose=True):
    """Write `model`'s posterior predictive to `filepath` as a SavedModel (TF-Serving compatible).

    Endpoints, all on an input batch `inputs` of the model's input shape (first axis any size):
      - "serving_default" (also "serve"): dict of float tensors. Classification: "probabilities" (batch, K)
        (Bernoulli: (batch,), the probability of class 1), "total_entropy" (the predictive entropy),
        "expected_entropy", "mutual_information" (batch,). Regression: "mean", "std", "total_variance",
        "aleatoric_variance", "epistemic_variance" (batch, d).
      - "predictive": model.predict's output; "uncertainty": model.uncertainty's dict;
        "particle_outputs": (batch, N, ...) per-particle logits or means.
      - "quantiles" (regression likelihoods): `quantiles(inputs, levels)` with levels a float vector of
        probabilities: exact quantiles of the particle mixture per output dimension, (batch, L, d).

    Example:
        >>> bayes_keras.export.export_predictive(model, "/tmp/lenet_predictive")   # or model.export(path)
        >>> served = tf.saved_model.load("/tmp/lenet_predictive")               # no bayes_keras needed
        >>> served.serve(x)["probabilities"], served.uncertainty(x)["mutual_information"]
    """
    if model.likelihood is None:
        raise ValueError(
            "export_predictive needs a model with a likelihood (it exports the predictive)."
        )
    if not model.built:
        raise ValueError("export_predictive needs a built model: call it, fit it or load it first.")
    signature = _input_signature(model, input_signature)
    likelihood = model.likelihood
    dtype = model.loss_dtype

    def particle_outputs(inputs):
        return tf.cast(model(inputs, training=False), dtype)

    def predictive(inputs):
        summary = likelihood.summary(particle_outputs(inputs))
        return dict(summary) if isinstance(summary, dict) else {"probabilities": summary}

    def uncertainty(inputs):
        return dict(likelihood.uncertainty(particle_outputs(inputs)))

    def serve(inputs):
        outputs = particle_outputs(inputs)
        summary = likelihood.summary(outputs)
        served = dict(summary) if isinstance(summary, dict) else {"probabilities": summary}
        served.update(likelihood.uncertainty(outputs))
        return served

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", serve, input_signature=signature)
    archive.add_endpoint("predictive", predictive, input_signature=signature)
    archive.add_endpoint("uncertainty", uncertainty, input_signature=signature)
    archive.add_endpoint("particle_outputs", particle_outputs, input_signature=signature)
    if likelihood.continuous:

        def quantiles(inputs, levels):
            mixture = likelihood.predictive(particle_outputs(inputs))
            levels = tf.cast(levels, dtype)
            # (L, batch, d) -> (batch, L, d)
            return tf.transpose(tf.map_fn(mixture.quantile, levels), (1, 0, 2))

        archive.add_endpoint(
            "quantiles",
            quantiles,
            input_signature=signature + [tf.TensorSpec((None,), dtype, name="levels")],
        )
    # Written beside the target, then swapped in: after a crash `filepath` holds the old or the new export, or
    # (if it is missing) its hidden backup holds the old one (bayes_keras/saving/atomic_files.py).
    # Keras' own message would name the temporary directory, so it is ours that names the target.
    result = atomic_files.replace_directory(
        str(filepath), lambda temporary: archive.write_out(temporary, verbose=False)
    )
    if verbose:
        endpoints = ["serve (serving_default)", "predictive", "uncertainty", "particle_outputs"]
        endpoints += ["quantiles"] if likelihood.continuous else []
        io_utils.print_msg(
            f"Saved the posterior predictive at '{filepath}'; endpoints: {', '.join(endpoints)}."
        )
    return result


def _input_signature(model, given=None):
    """The endpoints' signature: one argument, `inputs`, structured as the model's inputs (a tensor, a list or a
    dict of tensors). `given`: None (inferred from a functional model), one spec per model input as a flat list
    (or a dict), or the structure already nested in a one-element list ([[spec1, spec2]]), as Keras takes it."""
    structure = getattr(model, "input", None) if getattr(model, "inputs", None) else None
    if given is None:
        if structure is None:
            raise ValueError(
                "export_predictive infers the input signature from a functional model; pass "
                "input_signature=[tf.TensorSpec((None, ...), dtype)] (one spec per input) for this "
                "model."
            )
        # its serving signature's argument is called "inputs"
        single = len(keras.tree.flatten(structure)) == 1
        return [
            keras.tree.map_structure(
                lambda t: tf.TensorSpec(
                    (None,) + tuple(t.shape[1:]),
                    t.dtype,
                    name="inputs" if single else _spec_name(t),
                ),
                structure,
            )
        ]
    if isinstance(given, dict):
        return [given]
    given = list(given)
    inputs = keras.tree.flatten(structure) if structure is not None else None
    if (
        inputs
        and len(inputs) > 1
        and len(given) == len(inputs)
        and all(isinstance(s, tf.TensorSpec) for s in given)
    ):
        return [
            keras.tree.pack_sequence_as(structure, given)
        ]  # a flat list: one spec per model input
    if inputs and len(inputs) > 1 and len(given) != 1:
        raise ValueError(
            f"export_predictive: the model has {len(inputs)} inputs; pass one tf.TensorSpec per input "
            f"(a flat list or a dict) as input_signature; got {len(given)} entries."
        )
    return given


def _spec_name(tensor):
    name = getattr(tensor, "name", None) or "inputs"
    return name.split(":")[0].replace("/", "_")
