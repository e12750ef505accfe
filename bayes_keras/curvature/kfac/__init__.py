"""Kronecker-factored (KFAC) curvature of particle layers, as pure functions of `LayerRecord`s.

Conventions (tensorflow/kfac; Martens & Grosse 2015; Grosse & Martens 2016 for convolutions; Martens,
Ba & Johnson 2018 for recurrent layers), per layer and per particle n (every factor has a leading N axis):

- A layer's weights are viewed as matrices W (rows = inputs, columns = outputs): a Dense kernel
  (in, out), a Conv2D kernel reshaped to (kh*kw*C, F) in (kh, kw, C) order (the order of
  tf.image.extract_patches), a recurrent kernel (F or units, k*units). A bias is one more row, so a
  block covers [kernel; bias] as an (in+1, out) matrix and its input gets a homogeneous coordinate 1
  appended LAST. The curvature of the row-major vec(W) is approximated by A (x) G, which acts on a
  direction V (in+1, out) as A V G.
- Locations: the rows over which statistics are pooled are examples x locations, L locations per
  example: L = 1 for a Dense layer on (batch, [N,] in), L = the product of the middle axes for a Dense
  layer on (batch, [N,] ..., in), L = H' W' output positions for Conv2D, L = T time steps for
  recurrent layers (the "independence across time / space" approximation).
      A = (1 / (B L)) sum_{b, l} a~_bl a~_bl^T                      (mean over the B*L rows)
      G = dataset_scale * sum_{b, l} e_bl e_bl^T,   dataset_scale = n_train / (B * temperature)
  with a~ the input (+ 1) and e the per-example gradient of -log p(y_b | x_b, w_n) with respect to
  the pre-activation at location l (sum-loss convention: NOT the gradient of a batch-mean loss, which
  would shrink G by 1/B^2). Then
      A (x) G = (n_train / temperature) * L * E[a a^T] (x) E[e e^T]
  is the KFC / RNN-independence approximation of the tempered data set's Fisher
  (n_train / temperature) E_b[g_b g_b^T] (g_b the per-example weight gradient): the whole scale,
  data set, temperature and the location count L, sits in G. For one example at one location
  (B = L = 1) A (x) G is exactly dataset_scale * g g^T.
- Fisher: "empirical" uses the observed labels (record.output_gradients); "true" uses labels
  sampled from the model's own predictive, one per example and particle
  (record.sampled_output_gradients, filled by BayesianModel when the request samples labels).

Kronecker blocks per layer type (factor names in brackets; `kronecker_spec`):
- Dense, Conv2D: one block, rows [kernel; bias], [A] (x) [G].
- SimpleRNN, LSTM: z_t = x_t W + b + h_{t-1} U. Input block rows [W; b]: [A_in] from x_t (+ 1),
  [G] from e_t = d(-log p)/d z_t. Recurrent block rows [U]: [A_rec] from h_{t-1} (h_{-1} = 0) and the
  same [G] (the recurrent pre-activation h_{t-1} U enters z_t additively, so its gradient is e_t).
- GRU, reset_after=True (Keras' default): input block as above (b = bias row 0); recurrent block rows
  [U; b_rec] (b_rec = bias row 1), [A_rec] from h_{t-1} (+ 1), [G_rec] from the gradient with respect
  to g_t = h_{t-1} U + b_rec, which is (e_z, e_r, r_t * e_h) (the candidate uses a_h + r_t * g_h).
- GRU, reset_after=False: input block as above; the recurrent kernel splits by columns into U_zr
  (first 2*units columns, input h_{t-1}, [A_rec] (x) the (z, r) corner of [G]) and U_h (last units
  columns, input r_t * h_{t-1}, [A_reset] (x) the candidate corner of [G]).
- Embedding: a Dense layer on one-hot inputs, rows = the table (V, D), no bias: [A] (x) [G] with
  A = the mean over the B*L token positions of onehot onehot^T (diagonal: the token frequencies, kept as
  a dense V x V factor, so meant for vocabularies of hundreds to a few thousand; a larger table can
  be deterministic) and G from e = d(-log p)/d(embedding output). The input is the same for every
  particle (the embedding starts the particle axis).
- BatchNormalization: y = gamma * xhat + beta per particle and channel (xhat the normalised input, taken
  as given: the batch statistics' dependence on the example is ignored, as K-FAC implementations do for
  scale-and-shift layers). The per-example gradients are g_gamma = sum_l e_l xhat_l and g_beta = sum_l e_l
  per channel, and the curvature is their DIAGONAL Fisher: gamma and beta each as a (C, 1) matrix with
  [A_gamma] = dataset_scale * diag(sum_b g_gamma^2) (C x C) and [G_gamma] = [1] (likewise beta); the
  pi-split damping then acts as a plain damping of that diagonal.
Cross-covariances between the blocks of one layer are dropped (block-diagonal within the layer).

Modules: `blocks.py` (Piece, KroneckerBlock, LayerSpec), `specs.py` (how a layer's or a set of variables'
structure is found), `factors.py` (the `kfac_factors` dispatcher and the shared factor reductions), and
one module per layer kind with its spec and factors: `dense.py`, `conv.py`, `embedding.py`,
`batch_normalization.py`, `recurrent.py`; the supported kinds and the rules' look-up are
bayes_keras.curvature.kinds'. Every name is re-exported here.
"""

from bayes_keras.curvature.kfac.blocks import KroneckerBlock, LayerSpec, Piece
from bayes_keras.curvature.kinds import SUPPORTED_LAYERS
from bayes_keras.curvature.kfac.specs import candidate_specs, kronecker_spec
from bayes_keras.curvature.kfac.factors import (
    FISHER_TYPES,
    gradient_factor,
    input_factor,
    kfac_factors,
    sampled_negative_log_likelihood,
    split_damping,
)
from bayes_keras.curvature.kfac.dense import dense_factors, dense_spec
from bayes_keras.curvature.kfac.conv import (
    conv1d_factors,
    conv1d_patches,
    conv2d_factors,
    conv_locations,
    conv_patches,
)
from bayes_keras.curvature.kfac.embedding import (
    embedding_factors,
    embedding_locations,
    embedding_spec,
)
from bayes_keras.curvature.kfac.batch_normalization import (
    batch_normalization_factors,
    batch_normalization_spec,
    scale_shift_gradients,
)
from bayes_keras.curvature.kfac.recurrent import (
    gru_factors,
    gru_spec,
    recurrent_factors,
    recurrent_spec,
)

__all__ = [
    "KroneckerBlock",
    "LayerSpec",
    "Piece",
    "FISHER_TYPES",
    "SUPPORTED_LAYERS",
    "candidate_specs",
    "kronecker_spec",
    "gradient_factor",
    "input_factor",
    "kfac_factors",
    "sampled_negative_log_likelihood",
    "split_damping",
    "dense_factors",
    "dense_spec",
    "conv1d_factors",
    "conv1d_patches",
    "conv2d_factors",
    "conv_locations",
    "conv_patches",
    "embedding_factors",
    "embedding_locations",
    "embedding_spec",
    "batch_normalization_factors",
    "batch_normalization_spec",
    "scale_shift_gradients",
    "gru_factors",
    "gru_spec",
    "recurrent_factors",
    "recurrent_spec",
]
