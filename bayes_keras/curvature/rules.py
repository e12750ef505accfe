"""The curvature formulas of the shipped particle layers, declared by each layer class as its
`curvature_rules` (see bayes_keras.curvature.kinds)."""

from bayes_keras.curvature import diagonal, kfac
from bayes_keras.curvature.kinds import LayerCurvature

DENSE = LayerCurvature(
    "Dense", kfac.dense_spec, kfac.dense_factors, diagonal.dense_squared_gradients
)
CONV1D = LayerCurvature(
    "Conv1D", kfac.dense_spec, kfac.conv1d_factors, diagonal.conv1d_squared_gradients
)
CONV2D = LayerCurvature(
    "Conv2D", kfac.dense_spec, kfac.conv2d_factors, diagonal.conv2d_squared_gradients
)
SIMPLE_RNN = LayerCurvature("SimpleRNN", kfac.recurrent_spec, kfac.recurrent_factors)
LSTM = LayerCurvature("LSTM", kfac.recurrent_spec, kfac.recurrent_factors)
GRU = LayerCurvature("GRU", kfac.gru_spec, kfac.gru_factors)
BATCH_NORMALIZATION = LayerCurvature(
    "BatchNormalization",
    kfac.batch_normalization_spec,
    kfac.batch_normalization_factors,
    diagonal.batch_normalization_squared_gradients,
)
EMBEDDING = LayerCurvature(
    "Embedding", kfac.embedding_spec, kfac.embedding_factors, diagonal.embedding_squared_gradients
)
