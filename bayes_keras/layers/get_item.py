"""GetItem: indexing of the examples' axes of particle activations (BERT's `sequence[:, 0, :]`)."""

import keras

from bayes_keras.layers.particle_layout import IMAGE_RANK


def encode_key(key):
    """A Keras model's indexing key (ints, slices, None after a full batch slice) as JSON-serializable entries,
    or None when it is not one this layer takes (an Ellipsis, tensors, or the batch axis indexed)."""
    key = key if isinstance(key, tuple) else (key,)
    if not key or key[0] != slice(None):
        return None
    entries = []
    for k in key:
        if isinstance(k, slice) and all(
            v is None or isinstance(v, int) for v in (k.start, k.stop, k.step)
        ):
            entries.append(["slice", k.start, k.stop, k.step])
        elif isinstance(k, int) and not isinstance(k, bool):
            entries.append(["index", k])
        elif k is None:
            entries.append(["newaxis"])
        else:
            return None
    return entries


def _decode(entries):
    return tuple(
        slice(*e[1:]) if e[0] == "slice" else e[1] if e[0] == "index" else None for e in entries
    )


@keras.saving.register_keras_serializable(package="bayes_keras")
class GetItem(keras.layers.Layer):
    """`x[key]` as written for a Keras model's (batch, ...) tensor, applied to (batch, N, ...) particle
    activations: the key's axes after the batch axis move one to the right (the particle axis is kept whole).
    `bayes_keras.bayesianize` puts it where a converted model indexes particle activations (KerasHub's BERT
    takes the first token's features, `sequence[:, 0, :]`).

    Args:
        key: the entries of the Keras key (`encode_key`): the batch axis taken whole, then ints, slices and None.
    """

    def __init__(self, key, **kwargs):
        super().__init__(**kwargs)
        self.key = [list(e) for e in key]
        self._key = _decode(self.key)

    def call(self, inputs):
        if len(inputs.shape) == IMAGE_RANK:
            raise ValueError(
                f"GetItem '{self.name}' indexes (batch, particles, ...) activations; particle images "
                "(batch, H, W, particles, channels) are not supported."
            )
        return inputs[(self._key[0], slice(None)) + self._key[1:]]

    def get_config(self):
        return {**super().get_config(), "key": self.key}
