"""Every public class in keras.layers, placed after a particle layer on (batch, N, features) and on particle
images (batch, H, W, N, C): either the BayesianModel accepts it and the particles stay independent (one
particle's weights moved, every other particle's output bit-identical), or it is refused with the layer
named, or Keras itself cannot call it on that tensor. No fourth outcome.

`python tests/layers/test_keras_layer_sweep.py` rewrites the table in docs/keras_layers.md; the test checks that the
table there is the one the sweep gives.
"""

import inspect
import os
import sys

import keras
import numpy as np
import pytest

import bayes_keras as bk
from paths import ROOT

L = keras.layers
N = 3
DOCS = os.path.join(ROOT, "docs", "keras_layers.md")

# the obvious minimal arguments of classes without defaults
ARGUMENTS = {
    "Activation": ("relu",),
    "AlphaDropout": (0.1,),
    "Dropout": (0.1,),
    "GaussianDropout": (0.1,),
    "GaussianNoise": (0.1,),
    "SpatialDropout1D": (0.1,),
    "SpatialDropout2D": (0.1,),
    "SpatialDropout3D": (0.1,),
    "AdaptiveAveragePooling1D": (2,),
    "AdaptiveAveragePooling2D": (2,),
    "AdaptiveAveragePooling3D": (2,),
    "AdaptiveMaxPooling1D": (2,),
    "AdaptiveMaxPooling2D": (2,),
    "AdaptiveMaxPooling3D": (2,),
    "AveragePooling1D": (2,),
    "AveragePooling2D": (2,),
    "AveragePooling3D": (2,),
    "AvgPool1D": (2,),
    "AvgPool2D": (2,),
    "AvgPool3D": (2,),
    "Bidirectional": (lambda: L.LSTM(2),),
    "CenterCrop": (2, 2),
    "Conv1D": (2, 2),
    "Conv1DTranspose": (2, 2),
    "Conv2D": (2, 2),
    "Conv2DTranspose": (2, 2),
    "Conv3D": (2, 2),
    "Conv3DTranspose": (2, 2),
    "Convolution1D": (2, 2),
    "Convolution1DTranspose": (2, 2),
    "Convolution2D": (2, 2),
    "Convolution2DTranspose": (2, 2),
    "Convolution3D": (2, 2),
    "Convolution3DTranspose": (2, 2),
    "ConvLSTM1D": (2, 2),
    "ConvLSTM2D": (2, 2),
    "ConvLSTM3D": (2, 2),
    "Dense": (2,),
    "DepthwiseConv1D": (2,),
    "DepthwiseConv2D": (2,),
    "Dot": (-1,),
    "EinsumDense": ("...a,ab->...b", 2),
    "Embedding": (4, 2),
    "GRU": (2,),
    "LSTM": (2,),
    "SimpleRNN": (2,),
    "Lambda": (lambda: lambda x: 2.0 * x,),
    "MultiHeadAttention": (2, 2),
    "GroupQueryAttention": (2, 2, 1),
    "Permute": ((2, 1),),
    "RepeatVector": (2,),
    "Rescaling": (0.5,),
    "Reshape": ((-1,),),
    "Resizing": (2, 2),
    "ReversibleEmbedding": (4, 2),
    "SeparableConv1D": (2, 2),
    "SeparableConv2D": (2, 2),
    "SeparableConvolution1D": (2, 2),
    "SeparableConvolution2D": (2, 2),
    "SpectralNormalization": (lambda: L.Dense(2),),
    "TimeDistributed": (lambda: L.Dense(2),),
    "RandomBrightness": (0.1,),
    "RandomContrast": (0.1,),
    "RandomCrop": (2, 2),
    "RandomHue": (0.1,),
    "RandomRotation": (0.1,),
    "RandomTranslation": (0.1, 0.1),
    "RandomZoom": (0.1,),
    "RandomColorDegeneration": (0.1,),
    "RandomSaturation": (0.1,),
    "RandomSharpness": (0.1,),
    "RandomPosterization": (4,),
    "HashedCrossing": (4,),
    "GroupNormalization": (2,),
    "CategoryEncoding": (4,),
    "Discretization": ([0.0],),
    "Hashing": (3,),
    "GRUCell": (2,),
    "LSTMCell": (2,),
    "SimpleRNNCell": (2,),
}
# classes that are not layers one calls on an activation tensor (bases, cells, other frameworks' wrappers)
NOT_ACTIVATION_LAYERS = {
    "Layer",
    "InputLayer",
    "Wrapper",
    "RNN",
    "StackedRNNCells",
    "GRUCell",
    "LSTMCell",
    "SimpleRNNCell",
    "FlaxLayer",
    "JaxLayer",
    "TorchModuleWrapper",
    "TFSMLayer",
    "Pipeline",
    "MaxNumBoundingBoxes",
}
TWO_INPUTS = {
    "Add",
    "Average",
    "Concatenate",
    "Maximum",
    "Minimum",
    "Multiply",
    "Subtract",
    "Dot",
    "Attention",
    "AdditiveAttention",
}
QUERY_VALUE = {"MultiHeadAttention", "GroupQueryAttention"}


def _classes():
    for name in sorted(dir(L)):
        cls = getattr(L, name)
        if inspect.isclass(cls) and issubclass(cls, L.Layer) and name not in NOT_ACTIVATION_LAYERS:
            yield name, cls


def _construct(name, cls):
    args = tuple(
        a() if callable(a) and not isinstance(a, type) else a for a in ARGUMENTS.get(name, ())
    )
    return cls(*args, name=f"swept_{name.lower()}")


LAYOUTS = {
    "(batch, N, features)": (
        keras.Input((5,)),
        lambda: bk.layers.Dense(6, num_particles=N, name="first"),
        lambda: bk.layers.Dense(6, num_particles=N, name="second"),
    ),
    "(batch, N, T, features)": (
        keras.Input((5, 4)),
        lambda: bk.layers.Dense(6, num_particles=N, name="first"),
        lambda: bk.layers.Dense(6, num_particles=N, name="second"),
    ),
    "(batch, H, W, N, C)": (
        keras.Input((6, 6, 2)),
        lambda: bk.layers.Conv2D(4, 3, padding="same", num_particles=N, name="first"),
        lambda: bk.layers.Conv2D(4, 3, padding="same", num_particles=N, name="second"),
    ),
}


def _outcome(name, cls, layout):
    """'accepted', 'refused', 'Keras cannot call it here', or a description of a wrong outcome."""
    inputs_spec, first, second = LAYOUTS[layout]
    inputs = keras.Input(inputs_spec.shape[1:])
    first_layer = first()
    h = first_layer(inputs)
    try:
        layer = _construct(name, cls)
    except Exception as error:  # noqa: BLE001
        return f"cannot construct: {type(error).__name__}"
    try:
        if name in TWO_INPUTS:
            out = layer([h, second()(inputs)])
        elif name in QUERY_VALUE:
            out = layer(h, second()(inputs))
        else:
            out = layer(h)
        out = keras.tree.flatten(out)[0]
    except Exception:  # noqa: BLE001 - Keras' own error at the call: no model is built
        return "Keras cannot call it here"
    try:
        head = out
        if len(out.shape) in (4, 5):
            head = bk.layers.Flatten()(head)
        head = bk.layers.Dense(1)(head)
    except Exception:  # noqa: BLE001 - a tensor without the particle axis: the model is built on `out`
        head = out
    try:
        model = bk.BayesianModel(inputs, head, likelihood="normal")
    except ValueError as error:
        return (
            "refused"
            if layer.name in str(error)
            else f"ValueError without the layer's name: {error}"
        )
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    x = np.random.default_rng(0).standard_normal((2,) + tuple(inputs.shape[1:])).astype("float32")
    before = np.asarray(model(x, training=False))
    kernel = first_layer.kernel
    kernel.assign(
        kernel.numpy() + np.eye(N)[:, :1].reshape((N,) + (1,) * (len(kernel.shape) - 1))
    )  # particle 0
    after = np.asarray(model(x, training=False))
    if not np.array_equal(before[:, 1:], after[:, 1:]):
        return "accepted but mixes the particles"
    return "accepted"


def sweep():
    return {
        (name, layout): _outcome(name, cls, layout)
        for name, cls in _classes()
        for layout in LAYOUTS
    }


def _table(results):
    lines = [
        "| keras.layers class | " + " | ".join(LAYOUTS) + " |",
        "|---|" + "---|" * len(LAYOUTS),
    ]
    for name, _ in _classes():
        lines.append(
            f"| {name} | " + " | ".join(results[(name, layout)] for layout in LAYOUTS) + " |"
        )
    return "\n".join(lines)


_BEGIN, _END = "<!-- sweep table begins -->", "<!-- sweep table ends -->"


def _docs_table():
    text = open(DOCS).read()
    return text[text.index(_BEGIN) + len(_BEGIN) : text.index(_END)].strip()


@pytest.fixture(scope="module")
def results():
    keras.utils.set_random_seed(0)
    return sweep()


def test_every_keras_layer_is_accepted_and_independent_or_refused_by_name(results):
    allowed = {"accepted", "refused", "Keras cannot call it here"}
    wrong = {key: outcome for key, outcome in results.items() if outcome not in allowed}
    assert not wrong, wrong
    assert (
        sum(o == "accepted" for o in results.values()) >= 30
        and sum(o == "refused" for o in results.values()) >= 30
    )


def test_the_docs_table_is_the_sweep(results):
    assert _docs_table() == _table(results), (
        "regenerate it: python tests/layers/test_keras_layer_sweep.py"
    )


if __name__ == "__main__":
    table = _table(sweep())
    text = open(DOCS).read()
    text = text[: text.index(_BEGIN) + len(_BEGIN)] + "\n" + table + "\n" + text[text.index(_END) :]
    with open(DOCS, "w") as f:
        f.write(text)
    print(table)
    sys.exit(0)
