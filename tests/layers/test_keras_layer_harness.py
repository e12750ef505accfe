"""Keras' own layer-test harness (keras.src.testing.TestCase.run_layer_test: build, config and .keras
serialization round trips, symbolic / eager call, a training step, the mixed-precision policy check) on every
public particle layer: where the particle axis begins (num_particles) and later, shared (deterministic)
variants included."""

import keras
import pytest
from keras.src import testing

import bayes_keras as bk

N = 2
L = bk.layers

# (id, layer class, init kwargs, input shape, expected output shape, input dtype)
CASES = [
    ("dense_first", L.Dense, {"units": 3, "num_particles": N}, (2, 4), (2, N, 3), None),
    ("dense_later", L.Dense, {"units": 3}, (2, N, 4), (2, N, 3), None),
    (
        "dense_deterministic",
        L.Dense,
        {"units": 3, "deterministic": True},
        (2, N, 4),
        (2, N, 3),
        None,
    ),
    (
        "dense_deterministic_first",
        L.Dense,
        {"units": 3, "deterministic": True, "num_particles": N},
        (2, 4),
        (2, N, 3),
        None,
    ),
    (
        "conv1d_first",
        L.Conv1D,
        {"filters": 3, "kernel_size": 2, "num_particles": N},
        (2, 6, 3),
        (2, N, 5, 3),
        None,
    ),
    (
        "conv1d_later",
        L.Conv1D,
        {"filters": 3, "kernel_size": 2, "padding": "causal"},
        (2, N, 6, 3),
        (2, N, 6, 3),
        None,
    ),
    (
        "conv1d_deterministic",
        L.Conv1D,
        {"filters": 3, "kernel_size": 2, "deterministic": True},
        (2, N, 6, 3),
        (2, N, 5, 3),
        None,
    ),
    (
        "conv2d_first",
        L.Conv2D,
        {"filters": 3, "kernel_size": 2, "num_particles": N},
        (2, 5, 5, 2),
        (2, 4, 4, N, 3),
        None,
    ),
    (
        "conv2d_later",
        L.Conv2D,
        {"filters": 3, "kernel_size": 3, "padding": "same"},
        (2, 5, 5, N, 2),
        (2, 5, 5, N, 3),
        None,
    ),
    (
        "conv2d_deterministic",
        L.Conv2D,
        {"filters": 3, "kernel_size": 2, "deterministic": True},
        (2, 5, 5, N, 2),
        (2, 4, 4, N, 3),
        None,
    ),
    (
        "conv2d_grouped_first",
        L.Conv2D,
        {"filters": 4, "kernel_size": 2, "groups": 2, "num_particles": N},
        (2, 5, 5, 2),
        (2, 4, 4, N, 4),
        None,
    ),
    (
        "conv2d_grouped_later",
        L.Conv2D,
        {"filters": 4, "kernel_size": 2, "groups": 2},
        (2, 5, 5, N, 2),
        (2, 4, 4, N, 4),
        None,
    ),
    (
        "depthwise_conv2d_first",
        L.DepthwiseConv2D,
        {"kernel_size": 2, "depth_multiplier": 2, "num_particles": N},
        (2, 5, 5, 3),
        (2, 4, 4, N, 6),
        None,
    ),
    (
        "depthwise_conv2d_later",
        L.DepthwiseConv2D,
        {"kernel_size": 3, "padding": "same"},
        (2, 5, 5, N, 3),
        (2, 5, 5, N, 3),
        None,
    ),
    (
        "depthwise_conv2d_deterministic",
        L.DepthwiseConv2D,
        {"kernel_size": 2, "deterministic": True},
        (2, 5, 5, N, 3),
        (2, 4, 4, N, 3),
        None,
    ),
    (
        "separable_conv2d_first",
        L.SeparableConv2D,
        {"filters": 4, "kernel_size": 2, "num_particles": N},
        (2, 5, 5, 3),
        (2, 4, 4, N, 4),
        None,
    ),
    (
        "separable_conv2d_later",
        L.SeparableConv2D,
        {"filters": 4, "kernel_size": 3, "depth_multiplier": 2, "padding": "same"},
        (2, 5, 5, N, 3),
        (2, 5, 5, N, 4),
        None,
    ),
    (
        "separable_conv2d_deterministic",
        L.SeparableConv2D,
        {"filters": 4, "kernel_size": 2, "deterministic": True},
        (2, 5, 5, N, 3),
        (2, 4, 4, N, 4),
        None,
    ),
    ("dense_images", L.Dense, {"units": 3}, (2, 3, 3, N, 4), (2, 3, 3, N, 3), None),
    (
        "dense_images_first",
        L.Dense,
        {"units": 3, "num_particles": N},
        (2, 3, 3, 4),
        (2, 3, 3, N, 3),
        None,
    ),
    ("max_pooling2d", L.MaxPooling2D, {"pool_size": 2}, (2, 4, 4, N, 3), (2, 2, 2, N, 3), None),
    (
        "average_pooling2d",
        L.AveragePooling2D,
        {"pool_size": 2},
        (2, 4, 4, N, 3),
        (2, 2, 2, N, 3),
        None,
    ),
    ("global_average_pooling1d", L.GlobalAveragePooling1D, {}, (2, N, 5, 3), (2, N, 3), None),
    ("global_max_pooling1d", L.GlobalMaxPooling1D, {}, (2, N, 5, 3), (2, N, 3), None),
    ("global_average_pooling2d", L.GlobalAveragePooling2D, {}, (2, 3, 3, N, 4), (2, N, 4), None),
    ("global_max_pooling2d", L.GlobalMaxPooling2D, {}, (2, 3, 3, N, 4), (2, N, 4), None),
    ("flatten", L.Flatten, {}, (2, N, 3, 4), (2, N, 12), None),
    ("flatten_images", L.Flatten, {}, (2, 3, 3, N, 4), (2, N, 36), None),
    ("activation", L.Activation, {"activation": "relu"}, (2, N, 4), (2, N, 4), None),
    ("dropout", L.Dropout, {"rate": 0.5}, (2, N, 4), (2, N, 4), None),
    ("gaussian_noise", L.GaussianNoise, {"stddev": 0.3}, (2, N, 4), (2, N, 4), None),
    ("gaussian_dropout", L.GaussianDropout, {"rate": 0.3}, (2, N, 4), (2, N, 4), None),
    ("alpha_dropout", L.AlphaDropout, {"rate": 0.3}, (2, N, 4), (2, N, 4), None),
    ("simple_rnn_first", L.SimpleRNN, {"units": 3, "num_particles": N}, (2, 5, 4), (2, N, 3), None),
    (
        "simple_rnn_later",
        L.SimpleRNN,
        {"units": 3, "return_sequences": True},
        (2, N, 5, 4),
        (2, N, 5, 3),
        None,
    ),
    ("lstm_first", L.LSTM, {"units": 3, "num_particles": N}, (2, 5, 4), (2, N, 3), None),
    ("lstm_later", L.LSTM, {"units": 3}, (2, N, 5, 4), (2, N, 3), None),
    (
        "lstm_deterministic",
        L.LSTM,
        {"units": 3, "deterministic": True},
        (2, N, 5, 4),
        (2, N, 3),
        None,
    ),
    ("gru_first", L.GRU, {"units": 3, "num_particles": N}, (2, 5, 4), (2, N, 3), None),
    ("gru_later", L.GRU, {"units": 3, "reset_after": False}, (2, N, 5, 4), (2, N, 3), None),
    (
        "bidirectional_first",
        L.Bidirectional,
        {"layer": L.LSTM(3, num_particles=N)},
        (2, 5, 4),
        (2, N, 6),
        None,
    ),
    (
        "bidirectional_later",
        L.Bidirectional,
        {"layer": L.GRU(3, return_sequences=True), "merge_mode": "sum"},
        (2, N, 5, 4),
        (2, N, 5, 3),
        None,
    ),
    ("batch_normalization", L.BatchNormalization, {}, (2, N, 4), (2, N, 4), None),
    (
        "batch_normalization_images",
        L.BatchNormalization,
        {},
        (2, 3, 3, N, 4),
        (2, 3, 3, N, 4),
        None,
    ),
    (
        "batch_normalization_deterministic",
        L.BatchNormalization,
        {"deterministic": True},
        (2, N, 4),
        (2, N, 4),
        None,
    ),
    (
        "embedding",
        L.Embedding,
        {"input_dim": 7, "output_dim": 3, "num_particles": N},
        (2, 5),
        (2, N, 5, 3),
        "int32",
    ),
    (
        "embedding_deterministic",
        L.Embedding,
        {"input_dim": 7, "output_dim": 3, "deterministic": True, "num_particles": N},
        (2, 5),
        (2, N, 5, 3),
        "int32",
    ),
    ("layer_normalization", L.LayerNormalization, {}, (2, N, 4), (2, N, 4), None),
    (
        "layer_normalization_deterministic",
        L.LayerNormalization,
        {"deterministic": True},
        (2, N, 4),
        (2, N, 4),
        None,
    ),
    (
        "einsum_dense_first",
        L.EinsumDense,
        {
            "equation": "abc,cde->abde",
            "output_shape": (None, 2, 3),
            "bias_axes": "de",
            "num_particles": N,
        },
        (2, 5, 4),
        (2, N, 5, 2, 3),
        None,
    ),
    (
        "einsum_dense_later",
        L.EinsumDense,
        {"equation": "...b,bc->...c", "output_shape": 3, "bias_axes": "c"},
        (2, N, 5, 4),
        (2, N, 5, 3),
        None,
    ),
    (
        "einsum_dense_deterministic",
        L.EinsumDense,
        {
            "equation": "abcd,cde->abe",
            "output_shape": (None, 3),
            "bias_axes": "e",
            "deterministic": True,
        },
        (2, N, 5, 2, 4),
        (2, N, 5, 3),
        None,
    ),
    (
        "lora_einsum_dense_first",
        L.LoRAEinsumDense,
        {
            "equation": "abc,cde->abde",
            "output_shape": (None, 2, 3),
            "bias_axes": "de",
            "rank": 2,
            "num_particles": N,
        },
        (2, 5, 4),
        (2, N, 5, 2, 3),
        None,
    ),
    (
        "lora_einsum_dense_later",
        L.LoRAEinsumDense,
        {"equation": "...b,bc->...c", "output_shape": 3, "rank": 2},
        (2, N, 5, 4),
        (2, N, 5, 3),
        None,
    ),
    (
        "lora_embedding",
        L.LoRAEmbedding,
        {"input_dim": 7, "output_dim": 3, "rank": 2, "num_particles": N},
        (2, 5),
        (2, N, 5, 3),
        "int32",
    ),
    (
        "per_particle",
        L.PerParticle,
        {"layer": keras.layers.Softmax(axis=1)},
        (2, N, 5, 1),
        (2, N, 5, 1),
        None,
    ),
]


class LayerHarness(testing.TestCase):
    pass


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_keras_layer_harness(case):
    _, cls, kwargs, shape, expected, dtype = case
    harness = LayerHarness()
    harness.run_layer_test(
        cls,
        init_kwargs=kwargs,
        input_shape=shape,
        input_dtype=dtype or "float32",
        expected_output_shape=expected,
        run_training_check=True,
        run_mixed_precision_check=True,
    )


ATTENTION_CASES = [  # (id, init kwargs, {query_shape, value_shape[, key_shape]}, expected output shape)
    (
        "multi_head_attention_first",
        {"num_heads": 2, "key_dim": 3, "num_particles": N},
        {"query_shape": (2, 5, 4), "value_shape": (2, 6, 4)},
        (2, N, 5, 4),
    ),
    (
        "multi_head_attention_later",
        {"num_heads": 2, "key_dim": 3, "dropout": 0.1, "use_gate": True},
        {"query_shape": (2, N, 5, 4), "value_shape": (2, N, 6, 4)},
        (2, N, 5, 4),
    ),
    (
        "multi_head_attention_cross",
        {"num_heads": 2, "key_dim": 3, "output_shape": 5},
        {"query_shape": (2, N, 5, 4), "value_shape": (2, 6, 4), "key_shape": (2, 6, 4)},
        (2, N, 5, 5),
    ),
    (
        "multi_head_attention_lora",
        {"num_heads": 2, "key_dim": 3, "lora_rank": 2, "num_particles": N},
        {"query_shape": (2, 5, 4), "value_shape": (2, 5, 4)},
        (2, N, 5, 4),
    ),
    (
        "multi_head_attention_deterministic",
        {"num_heads": 1, "key_dim": 3, "deterministic": True},
        {"query_shape": (2, N, 5, 4), "value_shape": (2, N, 5, 4)},
        (2, N, 5, 4),
    ),
]


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_keras_layer_harness_attention(case):
    _, kwargs, shapes, expected = case
    # the harness' training check calls the layer on one (dict) argument; tests/layers/test_attention.py trains it
    LayerHarness().run_layer_test(
        L.MultiHeadAttention,
        init_kwargs=kwargs,
        input_shape=shapes,
        expected_output_shape=expected,
        run_training_check=False,
        run_mixed_precision_check=True,
    )


def test_every_public_particle_layer_is_covered():
    covered = {c[1].__name__ for c in CASES} | {"MultiHeadAttention"}
    public = set(bk.layers.__all__) - {"ParticleLayer"}
    assert public <= covered, public - covered
