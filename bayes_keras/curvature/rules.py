"""The curvature formulas of the shipped particle layers, declared by each layer class as its
`curvature_rules` (see bayes_keras.curvature.kinds)."""

from bayes_keras.curvature import diagonal
from bayes_keras.curvature.kfac.batch_normalization import (
    batch_normalization_factors,
    batch_normalization_spec,
)
from bayes_keras.curvature.kfac.conv import conv1d_factors, conv2d_factors
from bayes_keras.curvature.kfac.dense import dense_factors, dense_spec
from bayes_keras.curvature.kfac.embedding import embedding_factors, embedding_spec
from bayes_keras.curvature.kfac.recurrent import (
    gru_factors,
    gru_spec,
    recurrent_factors,
    recurrent_spec,
)
from bayes_keras.curvature.kinds import LayerCurvature

DENSE = LayerCurvature("Dense", dense_spec, dense_factors, diagonal.dense_squared_gradients)
CONV1D = LayerCurvature("Conv1D", dense_spec, conv1d_factors, diagonal.conv1d_squared_gradients)
CONV2D = LayerCurvature("Conv2D", dense_spec, conv2d_factors, diagonal.conv2d_squared_gradients)
SIMPLE_RNN = LayerCurvature("SimpleRNN", recurrent_spec, recurrent_factors)
LSTM = LayerCurvature("LSTM", recurrent_spec, recurrent_factors)
GRU = LayerCurvature("GRU", gru_spec, gru_factors)
BATCH_NORMALIZATION = LayerCurvature(
    "BatchNormalization",
    batch_normalization_spec,
    batch_normalization_factors,
    diagonal.batch_normalization_squared_gradients,
)
EMBEDDING = LayerCurvature(
    "Embedding", embedding_spec, embedding_factors, diagonal.embedding_squared_gradients
)
