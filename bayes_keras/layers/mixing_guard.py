"""Which plain Keras layers would mix particles or drop the particle axis, and what to use instead.

BayesianModel checks every plain Keras layer that receives a (batch, N, ...) tensor from a particle
layer: a layer that pools statistics over axis 1 (BatchNormalization, GroupNormalization), attends
across it (MultiHeadAttention over (batch, N, T, F)), or reads axis 1 as space or time (pooling,
convolution, Flatten, global pooling) would silently couple the particles or eat the particle axis,
so building such a model is an error that names the bayes_keras layer to use. Layers that act on the
last axis alone (Dense as a shared head, LayerNormalization, Dropout, activations, Add, Concatenate)
keep working.
"""

import keras

_L = keras.layers
# exact classes only: bayes_keras' own subclasses of Keras layers (e.g. Dropout) are particle-aware
REPLACEMENTS = {
    _L.BatchNormalization: "bayes_keras.layers.BatchNormalization (per-particle statistics)",
    _L.GroupNormalization: "keras.layers.LayerNormalization (acts per particle)",
    _L.MultiHeadAttention: "no particle attention yet: apply attention before the first particle layer",
    _L.Flatten: "bayes_keras.layers.Flatten",
    _L.GlobalAveragePooling1D: "bayes_keras.layers.GlobalAveragePooling1D",
    _L.GlobalAveragePooling2D: "bayes_keras.layers.GlobalAveragePooling2D",
    _L.GlobalMaxPooling1D: "bayes_keras.layers.GlobalMaxPooling1D",
    _L.GlobalMaxPooling2D: "bayes_keras.layers.GlobalMaxPooling2D",
    _L.MaxPooling2D: "bayes_keras.layers.MaxPooling2D",
    _L.AveragePooling2D: "bayes_keras.layers.AveragePooling2D",
    _L.MaxPooling1D: "no particle MaxPooling1D yet: use bayes_keras.layers.Conv1D with strides",
    _L.AveragePooling1D: "no particle AveragePooling1D yet: use bayes_keras.layers.Conv1D with strides",
    _L.Conv1D: "bayes_keras.layers.Conv1D",
    _L.Conv2D: "bayes_keras.layers.Conv2D",
    _L.SimpleRNN: "bayes_keras.layers.SimpleRNN",
    _L.LSTM: "bayes_keras.layers.LSTM",
    _L.GRU: "bayes_keras.layers.GRU",
}


def check_layers_keep_particles(layers, particle_layer_types):
    """Raise a ValueError for the first plain Keras layer in `layers` (topological order) that receives
    a particle-axis tensor and would mix particles or drop the axis.

    A tensor carries the particle axis if it is the output of a particle layer (an instance of
    `particle_layer_types`) or of any layer that received one."""
    carrying = set()
    for layer in layers:
        try:
            inputs, outputs = layer.input, layer.output
        except (AttributeError, ValueError):  # input layers, layers called more than once
            continue
        receives = any(id(t) in carrying for t in keras.tree.flatten(inputs))
        if isinstance(layer, particle_layer_types) or receives:
            replacement = REPLACEMENTS.get(type(layer))
            if receives and replacement is not None:
                raise ValueError(
                    f"Layer '{layer.name}' ({type(layer).__module__.split('.')[0]}.layers."
                    f"{type(layer).__name__}) receives (batch, particles, ...) activations and would mix the "
                    f"particles or drop the particle axis. Use {replacement}.")
            carrying.update(id(t) for t in keras.tree.flatten(outputs))
