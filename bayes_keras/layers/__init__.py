"""Particle-axis layers: Keras layers whose weights carry a leading particle axis (docs/architecture.md, "Particle axis")."""

from bayes_keras.layers.activation import Activation
from bayes_keras.layers.alpha_dropout import AlphaDropout
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.batch_normalization import BatchNormalization
from bayes_keras.layers.bidirectional import Bidirectional
from bayes_keras.layers.conv1d import Conv1D
from bayes_keras.layers.conv2d import Conv2D
from bayes_keras.layers.converted import Batchless, Converted  # noqa: F401 (made by bayesianize)
from bayes_keras.layers.dense import Dense
from bayes_keras.layers.depthwise_conv2d import DepthwiseConv2D
from bayes_keras.layers.dropout import Dropout
from bayes_keras.layers.einsum_dense import EinsumDense
from bayes_keras.layers.embedding import Embedding
from bayes_keras.layers.flatten import Flatten
from bayes_keras.layers.gaussian_dropout import GaussianDropout
from bayes_keras.layers.gaussian_noise import GaussianNoise
from bayes_keras.layers.get_item import GetItem  # noqa: F401 (made by bayesianize)
from bayes_keras.layers.global_pooling import (
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
)
from bayes_keras.layers.gru import GRU
from bayes_keras.layers.layer_normalization import LayerNormalization
from bayes_keras.layers.lora_einsum_dense import LoRAEinsumDense
from bayes_keras.layers.lora_embedding import LoRAEmbedding
from bayes_keras.layers.lstm import LSTM
from bayes_keras.layers.multi_head_attention import MultiHeadAttention
from bayes_keras.layers.per_particle import PerParticle
from bayes_keras.layers.pooling import AveragePooling2D, MaxPooling2D
from bayes_keras.layers.separable_conv2d import SeparableConv2D
from bayes_keras.layers.simple_rnn import SimpleRNN

__all__ = [
    "ParticleLayer",
    "Dense",
    "Conv1D",
    "Conv2D",
    "DepthwiseConv2D",
    "SeparableConv2D",
    "MaxPooling2D",
    "AveragePooling2D",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "Flatten",
    "Activation",
    "Dropout",
    "GaussianNoise",
    "GaussianDropout",
    "AlphaDropout",
    "SimpleRNN",
    "LSTM",
    "GRU",
    "Bidirectional",
    "BatchNormalization",
    "Embedding",
    "LayerNormalization",
    "EinsumDense",
    "MultiHeadAttention",
    "LoRAEinsumDense",
    "LoRAEmbedding",
    "PerParticle",
]
