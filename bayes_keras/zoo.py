"""Model zoo: standard architectures as BayesianModels (and their deterministic Keras twins)."""

import keras

from bayes_keras import layers
from bayes_keras.model import BayesianModel


def lenet5(input_shape=(8, 8, 1), num_classes=10, num_particles=10, deterministic_layers=(), **model_kwargs):
    """LeNet-5 with a particle axis: conv(6,5)-pool-conv(16,5)-pool-dense(120)-dense(84)-dense(classes).

    'same' padding keeps it valid for small inputs such as 8x8 digits (the original used 'valid'
    on 32x32). `deterministic_layers` names layers ("conv1", "conv2", "fc1", "fc2", "out") whose
    weights are shared by all particles (a hybrid network).

    Example:
        >>> model = bayes_keras.zoo.lenet5((8, 8, 1), 10, num_particles=10, likelihood="categorical")
    """
    det = set(deterministic_layers)
    unknown = det - {"conv1", "conv2", "fc1", "fc2", "out"}
    if unknown:
        raise ValueError(f"Unknown LeNet-5 layer names {sorted(unknown)}; use conv1, conv2, fc1, fc2, out.")
    model_kwargs.setdefault("likelihood", "categorical")
    inputs = keras.Input(input_shape)
    h = layers.Conv2D(6, 5, padding="same", activation="relu", num_particles=num_particles,
                      deterministic="conv1" in det, name="conv1")(inputs)
    h = layers.MaxPooling2D(2, name="pool1")(h)
    h = layers.Conv2D(16, 5, padding="same", activation="relu", deterministic="conv2" in det, name="conv2")(h)
    h = layers.MaxPooling2D(2, name="pool2")(h)
    h = layers.Flatten(name="flatten")(h)
    h = layers.Dense(120, activation="relu", deterministic="fc1" in det, name="fc1")(h)
    h = layers.Dense(84, activation="relu", deterministic="fc2" in det, name="fc2")(h)
    outputs = layers.Dense(num_classes, deterministic="out" in det, name="out")(h)
    return BayesianModel(inputs, outputs, name="bayesian_lenet5", **model_kwargs)


def keras_lenet5(input_shape=(8, 8, 1), num_classes=10):
    """The same LeNet-5 from plain Keras layers (the deterministic baseline; logits out)."""
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Conv2D(6, 5, padding="same", activation="relu", name="conv1"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(16, 5, padding="same", activation="relu", name="conv2"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(120, activation="relu", name="fc1"),
        keras.layers.Dense(84, activation="relu", name="fc2"),
        keras.layers.Dense(num_classes, name="out"),
    ], name="lenet5")


def gru_classifier(num_particles=10, units=32, num_classes=10, input_shape=(8, 8, 1), deterministic_layers=(),
                   **model_kwargs):
    """GRU classifier read row by row: image rows are time steps (digits: 8 steps of 8 pixels).

    input (batch, *input_shape) -> reshaped to (batch, input_shape[0], prod(rest)) -> GRU(units)
    -> Dense(num_classes) logits, (batch, N, num_classes). The default input is the (8, 8, 1)
    images of `bayes_keras.datasets.load_digits()`; a (T, F) input_shape takes sequences as is.
    `deterministic_layers` names layers ("gru", "out") whose weights are shared by all particles.

    Example:
        >>> model = bayes_keras.zoo.gru_classifier(10, units=32, num_classes=10)
    """
    det = set(deterministic_layers)
    unknown = det - {"gru", "out"}
    if unknown:
        raise ValueError(f"Unknown GRU classifier layer names {sorted(unknown)}; use gru, out.")
    input_shape = tuple(input_shape)
    if len(input_shape) < 2:
        raise ValueError(f"gru_classifier needs input_shape (time, features, ...); got {input_shape}.")
    model_kwargs.setdefault("likelihood", "categorical")
    inputs = keras.Input(input_shape)
    h = inputs
    if len(input_shape) > 2:
        features = 1
        for d in input_shape[1:]:
            features *= d
        h = keras.layers.Reshape((input_shape[0], features), name="rows")(h)
    h = layers.GRU(units, num_particles=num_particles, deterministic="gru" in det, name="gru")(h)
    outputs = layers.Dense(num_classes, deterministic="out" in det, name="out")(h)
    return BayesianModel(inputs, outputs, name="bayesian_gru_classifier", **model_kwargs)


def mlp(input_dim, output_dim, hidden=(50, 50), activation="relu", num_particles=10, **model_kwargs):
    """Fully connected BayesianModel: input_dim -> hidden... -> output_dim (logits or means).

    Example:
        >>> model = bayes_keras.zoo.mlp(10, 1, (50, 50), num_particles=10, likelihood="normal")
    """
    inputs = keras.Input((input_dim,))
    h = inputs
    for i, width in enumerate(hidden):
        h = layers.Dense(width, activation=activation, num_particles=num_particles if i == 0 else None,
                         name=f"dense_{i}")(h)
    outputs = layers.Dense(output_dim, num_particles=None if hidden else num_particles, name="out")(h)
    return BayesianModel(inputs, outputs, name="bayesian_mlp", **model_kwargs)


def keras_mlp(input_dim, output_dim, hidden=(50, 50), activation="relu"):
    """The same MLP from plain Keras layers."""
    return keras.Sequential([keras.Input((input_dim,))]
                            + [keras.layers.Dense(w, activation=activation) for w in hidden]
                            + [keras.layers.Dense(output_dim)], name="mlp")
