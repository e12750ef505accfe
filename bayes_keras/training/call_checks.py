"""Checks at the door of fit / evaluate / predict and the prediction methods: a bad argument is refused before
any work, with a message naming the argument and the value (or warned, where Keras accepts it and a user may mean
it), instead of an obscure error deep in TensorFlow, a hang, or a silently wrong result."""

import numbers
import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf


def in_memory(x):
    """Whether x is arrays (or a structure of them), not a tf.data.Dataset, a PyDataset or a generator."""
    return (
        x is not None
        and not isinstance(x, (tf.data.Dataset, keras.utils.PyDataset))
        and not hasattr(x, "__next__")
    )


def batch_size(value):
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
    ):
        raise ValueError(f"batch_size must be a positive integer or None; got {value!r}.")


def callbacks(value):
    """The callbacks as a list (one callback is accepted, as Keras does); Keras' own BackupAndRestore is warned
    (it writes its checkpoint in place and resumes at the start of the interrupted epoch)."""
    if value is None:
        return []
    value = [value] if isinstance(value, keras.callbacks.Callback) else value
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(c, keras.callbacks.Callback) for c in value
    ):
        raise ValueError(
            f"callbacks must be a list of keras.callbacks.Callback instances; got {value!r}."
        )
    for callback in value:
        if type(callback) is keras.callbacks.BackupAndRestore:
            warnings.warn(
                "keras.callbacks.BackupAndRestore writes its checkpoint over the last one (a job killed "
                "during the write cannot resume) and, with an integer save_freq, resumes at the start of the "
                "interrupted epoch, taking its first steps twice. bayes_keras.callbacks.BackupAndRestore "
                "takes the same arguments, writes atomically and resumes inside the epoch.",
                UserWarning,
                stacklevel=3,
            )
    return list(value)


_PASSED_RANDOM_LAYERS = weakref.WeakSet()  # models whose layers random_layers accepted


def random_layers(model, where, how):
    """`where`: "fit" or "bayesian_gradients". Under tf.distribute (`how`: "2 replicas" / "particle parallel"), refuse a layer that draws random numbers for
    its own input only: every replica's seed generator holds the same state, so rows b and b + B/2 (or particles n
    and n + N/2) would get the same noise, and training would not equal one device's. bayes_keras' random layers
    (`draws_as_one_device`) draw for the global batch and keep their part. A model that passed is not walked
    again (an eager custom loop calls this every step)."""
    if model in _PASSED_RANDOM_LAYERS:
        return
    for layer in model.operations:
        if not isinstance(layer, keras.layers.Layer) or getattr(
            layer, "draws_as_one_device", False
        ):
            continue
        weights = {id(w) for w in layer.weights}
        # no seed generator (its own or a sublayer's)
        if not any(id(v) not in weights for v in layer.variables):
            continue
        told = (
            f"{where}: layer '{layer.name}' ({type(layer).__name__}) draws random numbers for its own input only: under "
            f"{how} every replica would draw the same numbers for its part of the batch (examples b and b + B/2 "
            "would get the same"
        )
        if callable(getattr(layer, "transform_images", None)):  # Keras' image augmentation layers
            raise ValueError(
                f"{told} augmentation), and training would not equal one device's. Apply data augmentation in the "
                "tf.data pipeline (dataset.map) before the model, or train on one device. (Random layers that draw "
                "as one device: bayes_keras.layers.Dropout / GaussianNoise / GaussianDropout / AlphaDropout.)"
            )
        raise ValueError(
            f"{told} mask or noise), and training would not equal one device's. Use bayes_keras.layers.Dropout / "
            "GaussianNoise / GaussianDropout / AlphaDropout (Dropout's noise_shape gives spatial dropout; bayesianize "
            "converts Keras' own, SpatialDropout included), apply data augmentation in the tf.data pipeline "
            "(dataset.map), or train on one device."
        )
    _PASSED_RANDOM_LAYERS.add(model)


def sample_weight(value):
    if value is None or isinstance(value, (tf.data.Dataset, dict)):
        return
    try:
        weights = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"sample_weight must be numbers, one per example; got {value!r:.80}."
        ) from None
    if weights.size and not np.all(np.isfinite(weights)):
        raise ValueError(
            f"sample_weight must be finite; got {int(weights.size - np.count_nonzero(np.isfinite(weights)))}"
            " NaN / Inf value(s)."
        )
    if weights.size and weights.min() < 0:
        raise ValueError(
            "sample_weight must be non-negative (a negative weight would train on a negative loss); got "
            f"values in [{weights.min():.4g}, {weights.max():.4g}]."
        )


def class_weight(value, model=None):
    if value is None:
        return
    if not isinstance(value, dict):
        raise ValueError(
            f"fit: class_weight must be a dict {{class index: weight}}; got {value!r}."
        )
    keys = [k for k in value if isinstance(k, bool) or not isinstance(k, (int, np.integer))]
    if keys:
        raise ValueError(
            f"fit: class_weight's keys must be class indices (integers); got {keys[0]!r}."
        )
    try:
        classes = (
            model.outputs[0].shape[-1]
            if model is not None and len(model.outputs or []) == 1
            else None
        )
    except (AttributeError, ValueError):
        classes = None
    classes = 2 if classes == 1 else classes  # one logit (Bernoulli): classes 0 and 1
    outside = sorted(k for k in value if k < 0 or (classes is not None and k >= classes))
    if outside:
        raise ValueError(
            f"fit: class_weight names class {outside[0]}, which the model does not have (classes 0 to "
            f"{classes - 1 if classes else '...'}): its weight would never apply."
        )
    bad = {
        k: v
        for k, v in value.items()
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(v) or v < 0
    }
    if bad:
        raise ValueError(
            "fit: class_weight values must be finite and non-negative (a negative weight would train "
            f"towards the wrong labels); got {bad}."
        )


def not_empty(x, what, name="x"):
    leaves = (
        []
        if x is None or isinstance(x, (tf.data.Dataset, keras.utils.PyDataset))
        else tf.nest.flatten(x)
    )
    if (
        leaves
        and hasattr(leaves[0], "shape")
        and len(leaves[0].shape) > 0
        and leaves[0].shape[0] == 0
    ):
        raise ValueError(f"{what} got no examples: {name} has 0 rows.")


def _count(value, name, what, minimum):
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum
    ):
        raise ValueError(f"{what}: {name} must be an integer >= {minimum}; got {value!r}.")


def epochs(value, initial_epoch):
    """fit's epochs and initial_epoch: integers >= 0, initial_epoch <= epochs (Keras silently trains nothing)."""
    _count(value, "epochs", "fit", 0)
    _count(initial_epoch, "initial_epoch", "fit", 0)
    if value is not None and initial_epoch is not None and initial_epoch > value:
        raise ValueError(
            f"fit: initial_epoch ({initial_epoch}) must not exceed epochs ({value}): fit trains epochs "
            f"initial_epoch + 1 .. epochs (epochs is the last epoch's number, not a count)."
        )


def validation_split(value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"fit: validation_split must be a fraction in [0, 1); got {value!r}.")


def targets(x, y, what):
    """Arrays (or a dict / list of arrays) as x need y: without it Keras fails deep in the loss."""
    if y is None and in_memory(x):
        raise ValueError(
            f"{what}: y is None, but x is {type(x).__name__}: pass the targets as y (or give a "
            "tf.data.Dataset / PyDataset / generator of (x, y) batches)."
        )


def target_values(model, y, what, name="y"):
    """In-memory targets the model's likelihood can score (class labels in range, finite values), checked before
    any work: a bad label otherwise fails in a graph assertion, or trains silently on a truncated value."""
    if y is None or model.likelihood is None or not in_memory(y) or isinstance(y, dict):
        return
    leaves = tf.nest.flatten(y)
    if len(leaves) != 1:
        return
    try:
        output_shape = tuple(model.outputs[0].shape) if len(model.outputs or []) == 1 else None
    except (AttributeError, ValueError):  # a subclassed model
        output_shape = None
    model.likelihood.check_targets(np.asarray(leaves[0]), output_shape, what, name)


def validation_data(model, value):
    """fit's validation_data: (x, y) or (x, y, sample_weight) of in-memory arrays, checked like fit's own."""
    if (
        value is None
        or isinstance(value, (tf.data.Dataset, keras.utils.PyDataset))
        or hasattr(value, "__next__")
    ):
        return
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
        length = (
            f"a {type(value).__name__} of {len(value)}"
            if isinstance(value, (tuple, list))
            else repr(value)
        )
        raise ValueError(
            f"fit: validation_data must be (x, y) or (x, y, sample_weight), or a dataset; got {length}."
        )
    inputs(model, value[0], "fit", "validation_data's x")
    not_empty(value[0], "fit: validation_data")
    target_values(model, value[1], "fit", "validation_data's y")
    if len(value) == 3:
        sample_weight(value[2])


def flags(verbose, shuffle, what):
    """fit's verbose ("auto", 0, 1, 2) and shuffle (True, False, "batch"); Keras accepts anything."""
    if not (
        verbose == "auto"
        or (
            isinstance(verbose, (int, np.integer))
            and not isinstance(verbose, bool)
            and verbose in (0, 1, 2)
        )
    ):
        raise ValueError(f"{what}: verbose must be 'auto', 0, 1 or 2; got {verbose!r}.")
    if shuffle is not None and not (isinstance(shuffle, (bool, np.bool_)) or shuffle == "batch"):
        raise ValueError(f"{what}: shuffle must be True, False or 'batch'; got {shuffle!r}.")


def steps(x, value, what, name="steps", warn_unknown=True):
    """`steps` (or steps_per_epoch) of a call over `x`: a positive integer; required for an infinite tf.data
    dataset, which would otherwise never end; warned for a generator or a PyDataset without a length, whose end
    only the data knows (`warn_unknown`)."""
    _count(value, name, what, 1)
    if value is not None:
        return
    if isinstance(x, tf.data.Dataset) and int(x.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        raise ValueError(
            f"{what}: x is an infinite tf.data.Dataset (it repeats without end), so the call would "
            f"never return: pass {name}= (the number of batches), or give a finite dataset."
        )
    if warn_unknown and (
        (hasattr(x, "__next__") and not isinstance(x, tf.data.Dataset))
        or (isinstance(x, keras.utils.PyDataset) and x.num_batches is None)
    ):
        warnings.warn(
            f"{what}: x is a {type(x).__name__} without a known length and no steps= was given: the call "
            f"runs until it is exhausted (forever, if it never is). Pass {name}= to bound it.",
            UserWarning,
            stacklevel=3,
        )


def inputs(model, x, what, name="x"):
    """Inputs of a one-input functional model: an array with a batch axis and the model's per-example shape (a wrong
    feature count failed in a MatMul deep in the graph; a list of lists or a scalar in the training-set count); a
    tf.data.Dataset's elements are checked by their spec."""
    if x is None:
        raise ValueError(
            f"{what}: {name} is None; pass the inputs (arrays, a tf.data.Dataset, a PyDataset or a "
            "generator)."
        )
    if isinstance(x, (numbers.Number, str, bytes)):
        raise ValueError(
            f"{what}: {name} is a scalar ({x!r}); pass an array with one row per example."
        )
    try:
        model_inputs = list(model.inputs or [])
    except (AttributeError, ValueError):  # a subclassed model: its inputs are what its call takes
        model_inputs = []
    if isinstance(x, tf.data.Dataset):
        spec = x.element_spec
        spec = spec[0] if isinstance(spec, tuple) else spec
        if len(model_inputs) == 1 and isinstance(spec, tf.TensorSpec):
            _check_shape(
                tuple(spec.shape),
                tuple(model_inputs[0].shape),
                what,
                f"{name} (a tf.data.Dataset's batches)",
            )
        return
    if not in_memory(x):
        return
    for leaf in tf.nest.flatten(x):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None:
            continue
        text = dtype == tf.string if isinstance(dtype, tf.DType) else np.dtype(dtype).kind in "USO"
        if text:
            raise ValueError(
                f"{what}: {name} holds {dtype} values (strings or objects), not numbers; "
                "convert them (e.g. with a keras.layers.StringLookup) first."
            )
    if len(model_inputs) != 1:
        return
    if isinstance(x, (list, tuple)) and x and not hasattr(x[0], "shape"):
        raise ValueError(
            f"{what}: {name} is a Python {type(x).__name__} of {type(x[0]).__name__}s; pass an array "
            "(np.asarray(x)) with one row per example."
        )
    if not hasattr(x, "shape"):
        return
    shape, expected = tuple(x.shape), tuple(model_inputs[0].shape)
    if len(shape) == 0:
        raise ValueError(
            f"{what}: {name} is a scalar; pass an array with one row per example, of shape (batch,) + "
            f"{expected[1:]}."
        )
    _check_shape(shape, expected, what, name)


def _check_shape(shape, expected, what, name):
    given = shape
    # Keras adds the trailing axis of 1, as it removes one
    if len(shape) + 1 == len(expected) and expected[-1] == 1:
        shape = shape + (1,)
    elif len(shape) == len(expected) + 1 and shape[-1] == 1:
        shape = shape[:-1]
    if len(shape) != len(expected) or any(
        e is not None and s is not None and s != e for s, e in zip(shape[1:], expected[1:])
    ):
        raise ValueError(
            f"{what}: {name} has shape {given}, the model takes (batch,) + {expected[1:]} (one "
            f"example's shape {expected[1:]}, got {given[1:]})."
        )


def non_finite_inputs(x, what, name="x"):
    """Warn when in-memory inputs hold NaN / Inf (one pass over them, before the call); returns their count."""
    if not in_memory(x):
        return 0
    count = 0
    for leaf in tf.nest.flatten(x):
        array = np.asarray(leaf)
        if np.issubdtype(array.dtype, np.floating):
            count += int(array.size - np.count_nonzero(np.isfinite(array)))
    warn_non_finite(count, what, name)
    return count


def count_non_finite(inputs):
    """The NaN / Inf entries of a batch's floating-point inputs, an int64 tensor (one reduction per input, traced
    beside the forward pass)."""
    counts = [
        tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(t)), tf.int64))
        for t in tf.nest.flatten(inputs)
        if t.dtype.is_floating
    ]
    return tf.add_n(counts) if counts else tf.constant(0, tf.int64)


def warn_non_finite(count, what, name="x"):
    if count:
        warnings.warn(
            f"{what}: {name} holds {count} NaN / Inf value(s); the outputs of the examples holding them are "
            "NaN or meaningless.",
            RuntimeWarning,
            stacklevel=3,
        )
