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
"""

import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from bayes_keras.curvature.kinds import layer_curvature, layer_kind
from bayes_keras.likelihoods import Likelihood

SUPPORTED_LAYERS = (
    "Dense",
    "Conv1D",
    "Conv2D",
    "SimpleRNN",
    "LSTM",
    "GRU",
    "Embedding",
    "BatchNormalization",
)
FISHER_TYPES = ("empirical", "true")


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows [row_start, row_start + row_count) of a variable viewed as a (rows, width) matrix."""

    variable: object
    row_start: int
    row_count: int


@dataclasses.dataclass(frozen=True)
class KroneckerBlock:
    """One Kronecker-factored block A (x) G of a layer.

    The block's weight matrix (p, q) stacks `pieces` (row slices of the layer's variables) and keeps
    their columns [columns[0], columns[1]) (all columns when `columns` is None). `a` and `g` name
    factors of `LayerSpec.factor_dims`; G is restricted to the same column range. `role` names the
    block within its layer ("weights", "input", "recurrent", "recurrent_zr", "recurrent_h").
    """

    role: str
    a: str
    g: str
    pieces: tuple
    columns: tuple = None


@dataclasses.dataclass(frozen=True, eq=False)
class LayerSpec:
    """The KFAC structure of one particle layer: factor sizes, matrix views of its variables, blocks.

    `kind` names the layer type in messages; `reset_after` is set for GRU; `layer` is the layer when the spec
    was made from it (`kronecker_spec`), None when it was inferred from the variables (`candidate_specs`);
    `kernel_and_bias`: the weights are one [kernel; bias] block whose A factor is over the layer's inputs."""

    kind: str
    factor_dims: dict  # name -> d (factor is (N, d, d))
    views: tuple  # ((variable, (rows, width)), ...) in the layer's variable order
    blocks: tuple  # KroneckerBlock, ...
    reset_after: bool = None
    layer: object = None
    # one [kernel; bias] block over the layer's inputs (Dense, Conv1D, Conv2D)
    kernel_and_bias: bool = False

    @property
    def variables(self):
        return [v for v, _ in self.views]

    def view(self, variable):
        for v, shape in self.views:
            if v is variable:
                return shape
        raise KeyError(variable.path)

    def block_shape(self, block):
        """(p, q) of a block's weight matrix."""
        p = sum(piece.row_count for piece in block.pieces)
        width = self.view(block.pieces[0].variable)[1]
        q = width if block.columns is None else block.columns[1] - block.columns[0]
        return p, q

    def same_structure(self, other):
        """Same layer kind, factors, variables (by identity), views and blocks."""

        def key(spec):
            blocks = tuple(
                (
                    b.role,
                    b.a,
                    b.g,
                    b.columns,
                    tuple((id(pc.variable), pc.row_start, pc.row_count) for pc in b.pieces),
                )
                for b in spec.blocks
            )
            return (
                spec.kind,
                spec.reset_after,
                tuple(sorted(spec.factor_dims.items())),
                tuple((id(v), shape) for v, shape in spec.views),
                blocks,
            )

        return key(self) == key(other)


def kronecker_spec(layer):
    """The `LayerSpec` of a built bayes_keras particle layer (Dense, Conv2D, SimpleRNN, LSTM, GRU, or a
    layer whose class declares `curvature_rules` with a Kronecker spec).

    Raises:
        ValueError: for other layers, deterministic layers, and variables whose shapes do not match
            the layer's configuration.
    """
    rules = _kronecker_rules(layer)
    if getattr(layer, "deterministic", False):
        raise ValueError(
            f"Layer '{layer.name}' is deterministic (shared weights): it has no particle curvature."
        )
    return rules.kronecker_spec(layer)


def _kronecker_rules(layer):
    rules = layer_curvature(layer)
    if rules is None or rules.kronecker_spec is None:
        raise ValueError(
            f"KFAC supports the particle layers {', '.join(SUPPORTED_LAYERS)}; layer "
            f"'{getattr(layer, 'name', repr(layer))}' is a {layer_kind(layer)}."
        )
    return rules


def dense_spec(layer):
    """Kronecker spec of a Dense, Conv1D or Conv2D particle layer: one block [kernel; bias]."""
    return _spec(layer_kind(layer), layer.kernel, getattr(layer, "bias", None), layer=layer)


def embedding_spec(layer):
    """Kronecker spec of an Embedding particle layer: one block, the (V, D) table."""
    return _embedding_spec(layer.embeddings, layer)


def _embedding_spec(table, layer=None):
    rows, out = int(table.shape[1]), int(table.shape[2])
    return LayerSpec(
        "Embedding",
        {"A": rows, "G": out},
        ((table, (rows, out)),),
        (KroneckerBlock("weights", "A", "G", (Piece(table, 0, rows),)),),
        layer=layer,
    )


def batch_normalization_spec(layer):
    """Kronecker spec of a BatchNormalization particle layer: a diagonal block for gamma and one for beta."""
    return _batch_normalization_spec([v for v in (layer.gamma, layer.beta) if v is not None], layer)


def _batch_normalization_spec(variables, layer=None):
    dims, views, blocks = {}, [], []
    for variable in variables:
        role = variable.name.split("/")[-1]  # "gamma" or "beta"
        channels = int(variable.shape[1])
        dims.update({f"A_{role}": channels, f"G_{role}": 1})
        views.append((variable, (channels, 1)))
        blocks.append(
            KroneckerBlock(role, f"A_{role}", f"G_{role}", (Piece(variable, 0, channels),))
        )
    return LayerSpec("BatchNormalization", dims, tuple(views), tuple(blocks), layer=layer)


def recurrent_spec(layer):
    """Kronecker spec of a SimpleRNN or LSTM particle layer: an input and a recurrent block."""
    return _spec(
        layer_kind(layer),
        layer.kernel,
        getattr(layer, "bias", None),
        layer.recurrent_kernel,
        int(layer.units),
        None,
        layer,
    )


def gru_spec(layer):
    """Kronecker spec of a GRU particle layer: an input block and, by its `reset_after`, one recurrent block
    (reset after the recurrent matmul) or two (the update / reset gates' and the candidate's)."""
    return _spec(
        layer_kind(layer),
        layer.kernel,
        getattr(layer, "bias", None),
        layer.recurrent_kernel,
        int(layer.units),
        bool(layer.reset_after),
        layer,
    )


def candidate_specs(variables):
    """The possible `LayerSpec`s of one layer's particle variables (N, ...), from their names ("kernel",
    "recurrent_kernel", "bias") and shapes alone: a kernel of rank 3 (+ bias) is a Dense layer, of rank
    5 a Conv2D; with a recurrent kernel (N, units, k*units) it is SimpleRNN (k = 1), GRU (3) or LSTM (4),
    and a GRU's bias (N, 2, 3*units) means reset_after. Usually one candidate; two for a GRU without
    bias (reset_after unknown).

    Raises:
        ValueError: when the variables are not those of a supported particle layer.
    """
    names = {}
    for v in variables:
        names.setdefault(v.name.split("/")[-1], []).append(v)
    where = ", ".join(v.path for v in variables)
    if (
        set(names) == {"embeddings"}
        and len(names["embeddings"]) == 1
        and len(names["embeddings"][0].shape) == 3
    ):
        return [_embedding_spec(names["embeddings"][0])]
    if (
        names
        and set(names) <= {"gamma", "beta"}
        and all(len(vs) == 1 and len(vs[0].shape) == 2 for vs in names.values())
    ):
        return [_batch_normalization_spec(list(variables))]
    if (
        any(len(vs) > 1 for vs in names.values())
        or "kernel" not in names
        or not set(names) <= {"kernel", "recurrent_kernel", "bias"}
    ):
        raise ValueError(
            f"KFAC: the particle variables [{where}] are not those of a supported particle layer "
            f"({', '.join(SUPPORTED_LAYERS)}: a kernel, an optional recurrent_kernel and an optional "
            "bias). For other layers (attention, EinsumDense, LoRA factors) use an optimizer without "
            "curvature, which trains them with its defaults: GaussianParticleFlow, SVGD, MGVBP, "
            "IndependentParticles. (preconditioner='identity' makes MatrixSVGD / PreconditionedParticles "
            "take plain gradient steps on the dataset-scaled log posterior: their learning rate must then "
            "be set to that scale, about 1 / dataset_size.)"
        )
    kernel, bias = names["kernel"][0], names.get("bias", [None])[0]
    if "recurrent_kernel" not in names:
        kind = {3: "Dense", 4: "Conv1D", 5: "Conv2D"}.get(len(kernel.shape))
        if kind is None:
            raise ValueError(
                f"KFAC: kernel {kernel.path} of shape {tuple(kernel.shape)} is not a Dense (N, in, out), "
                "Conv1D (N, k, C, F) or Conv2D (N, kh, kw, C, F) particle kernel."
            )
        return [_spec(kind, kernel, bias)]
    recurrent = names["recurrent_kernel"][0]
    if len(kernel.shape) != 3 or len(recurrent.shape) != 3:
        raise ValueError(
            f"KFAC: recurrent variables [{where}] must be kernel (N, F, k*units) and recurrent_kernel "
            "(N, units, k*units)."
        )
    units, width = int(recurrent.shape[1]), int(recurrent.shape[2])
    gates = width // units if width % units == 0 else 0
    kind = {1: "SimpleRNN", 3: "GRU", 4: "LSTM"}.get(gates)
    if kind is None:
        raise ValueError(
            f"KFAC: recurrent kernel {recurrent.path} of shape {tuple(recurrent.shape)} has "
            f"{width} columns for {units} units: not SimpleRNN (1x), GRU (3x) or LSTM (4x)."
        )
    if gates != 3:  # only a GRU's structure depends on a flag (reset_after) the shapes may not show
        return [_spec(kind, kernel, bias, recurrent, units)]
    if bias is not None:
        return [_spec(kind, kernel, bias, recurrent, units, len(bias.shape) == 3)]
    return [
        _spec(kind, kernel, None, recurrent, units, True),
        _spec(kind, kernel, None, recurrent, units, False),
    ]


def _spec(kind, kernel, bias, recurrent=None, units=None, reset_after=None, layer=None):
    """The structure from the variables: no recurrent kernel, one [kernel; bias] block (Dense, Conv1D, Conv2D);
    with one, an input block and the recurrent block(s): reset_after None (SimpleRNN, LSTM) one, True (GRU
    reset after the matmul, its recurrent bias a second bias row) one with its own G, False (GRU reset
    before) two. `kind` names the structure in messages only."""
    has_bias = bias is not None
    if recurrent is None:  # Dense, Conv1D, Conv2D
        out = int(kernel.shape[-1])
        rows = int(np.prod(kernel.shape[1:-1]))
        views = [(kernel, (rows, out))]
        pieces = [Piece(kernel, 0, rows)]
        if has_bias:
            _check_shape(bias, (out,))
            views.append((bias, (1, out)))
            pieces.append(Piece(bias, 0, 1))
        return LayerSpec(
            kind,
            {"A": rows + has_bias, "G": out},
            tuple(views),
            (KroneckerBlock("weights", "A", "G", tuple(pieces)),),
            layer=layer,
            kernel_and_bias=True,
        )
    features, width = int(kernel.shape[1]), int(kernel.shape[2])
    _check_shape(recurrent, (units, width))
    views = [(kernel, (features, width)), (recurrent, (units, width))]
    in_pieces = [Piece(kernel, 0, features)]
    rec_pieces = [Piece(recurrent, 0, units)]
    if has_bias:
        bias_rows = 2 if reset_after else 1
        _check_shape(bias, (2, width) if reset_after else (width,))
        views.append((bias, (bias_rows, width)))
        in_pieces.append(Piece(bias, 0, 1))
        if reset_after:
            rec_pieces.append(Piece(bias, 1, 1))
    dims = {"A_in": features + has_bias, "G": width}
    blocks = [KroneckerBlock("input", "A_in", "G", tuple(in_pieces))]
    if reset_after is False:
        dims.update({"A_rec": units, "A_reset": units})
        blocks += [
            KroneckerBlock("recurrent_zr", "A_rec", "G", tuple(rec_pieces), (0, 2 * units)),
            KroneckerBlock("recurrent_h", "A_reset", "G", tuple(rec_pieces), (2 * units, width)),
        ]
    elif reset_after:
        dims.update({"A_rec": units + has_bias, "G_rec": width})
        blocks.append(KroneckerBlock("recurrent", "A_rec", "G_rec", tuple(rec_pieces)))
    else:
        dims["A_rec"] = units
        blocks.append(KroneckerBlock("recurrent", "A_rec", "G", tuple(rec_pieces)))
    return LayerSpec(kind, dims, tuple(views), tuple(blocks), reset_after, layer)


def _check_shape(variable, shape):
    if tuple(int(d) for d in variable.shape[1:]) != tuple(shape):
        raise ValueError(
            f"KFAC: variable {variable.path} has per-particle shape {tuple(variable.shape[1:])}, "
            f"expected {tuple(shape)}."
        )


# -- factors -------------------------------------------------------------------------------------
def kfac_factors(record, fisher="empirical"):
    """This batch's Kronecker factors of one layer (see the module docstring for the scale).

    Args:
        record: a `LayerRecord` with output gradients filled in (after BayesianModel's backward pass).
        fisher: "empirical" (observed labels) or "true" (labels sampled from the model).

    Returns:
        dict factor name -> (N, d, d) tensor, names as in `kronecker_spec(record.layer).factor_dims`.
    """
    if fisher not in FISHER_TYPES:
        raise ValueError(f"fisher must be one of {FISHER_TYPES}; got {fisher!r}.")
    e = record.output_gradients if fisher == "empirical" else record.sampled_output_gradients
    layer = record.layer
    if e is None:
        what = (
            "output_gradients"
            if fisher == "empirical"
            else "sampled_output_gradients (the optimizer's curvature_request must sample labels)"
        )
        raise ValueError(f"KFAC: the record of layer '{layer.name}' has no {what}.")
    if record.dataset_scale is None:
        raise ValueError(f"KFAC: the record of layer '{layer.name}' has no dataset_scale.")
    rules = _kronecker_rules(layer)
    return rules.kronecker_factors(layer, record, e, tf.cast(record.dataset_scale, e.dtype))


def dense_factors(layer, record, e, scale):
    """{"A", "G"} of a Dense particle layer (L locations for inputs (batch, [N,] ..., in))."""
    n, batch = int(layer.num_particles), tf.shape(e)[0]
    in_dim = int(layer.kernel.shape[1])
    a = tf.reshape(record.inputs, (batch, 1 if layer.broadcasts else n, -1, in_dim))
    e = tf.reshape(e, (batch, n, -1, layer.units))
    return {"A": input_factor(a, layer.bias is not None, n), "G": gradient_factor(e, scale)}


def conv2d_factors(layer, record, e, scale):
    """{"A", "G"} of a Conv2D particle layer (the H'W' output positions are the locations)."""
    n = int(layer.num_particles)
    return {
        "A": input_factor(conv_patches(layer, record.inputs), layer.bias is not None, n),
        "G": gradient_factor(conv_locations(layer, e), scale),
    }


def conv1d_factors(layer, record, e, scale):
    """{"A", "G"} of a Conv1D particle layer (the T' output steps are the locations; e is (B, N, T', F))."""
    n = int(layer.num_particles)
    return {
        "A": input_factor(conv1d_patches(layer, record.inputs), layer.bias is not None, n),
        "G": gradient_factor(e, scale),
    }


class _Conv1DAsConv2D(NamedTuple):
    """A Conv1D's geometry as a Conv2D of height 1 (what `conv_patches` reads)."""

    kernel_size: tuple
    strides: tuple
    dilation_rate: tuple
    padding: str
    broadcasts: bool
    num_particles: int


def conv1d_patches(layer, x):
    """Input patches of a particle Conv1D whose input is x, (B, N, T, C) (or a first layer's (B, T, C)):
    (B, N or 1, T', k*C) in the kernel's (k, C) order: the sequence as an image of height 1 ('causal' pads
    (k - 1) d steps on the left first, as the layer does)."""
    x = tf.convert_to_tensor(x)
    if layer.padding == "causal":
        pad = (layer.kernel_size - 1) * layer.dilation_rate
        x = tf.pad(x, [[0, 0]] * (len(x.shape) - 2) + [[pad, 0], [0, 0]])
    # (B, 1, T, [N,] C)
    images = tf.expand_dims(x if layer.broadcasts else tf.transpose(x, [0, 2, 1, 3]), 1)
    view = _Conv1DAsConv2D(
        (1, layer.kernel_size),
        (1, layer.strides),
        (1, layer.dilation_rate),
        "valid" if layer.padding == "causal" else layer.padding,
        layer.broadcasts,
        int(layer.num_particles),
    )
    return conv_patches(view, images)


def conv_locations(layer, e):
    """A Conv2D's output-shaped tensor (B, H', W', N, F) -> (B, N, H'W', F): the locations of each particle."""
    e = tf.reshape(e, (tf.shape(e)[0], -1, int(layer.num_particles), layer.filters))
    return tf.transpose(e, [0, 2, 1, 3])


def embedding_locations(layer, ids, e):
    """An Embedding's token ids and output gradient as locations: (one-hot ids (B, 1, L, V), e (B, N, L, D))."""
    batch = tf.shape(e)[0]
    one_hot = tf.one_hot(
        tf.reshape(tf.cast(ids, tf.int32), (batch, 1, -1)), layer.input_dim, dtype=e.dtype
    )
    return one_hot, tf.reshape(e, (batch, int(layer.num_particles), -1, layer.output_dim))


def embedding_factors(layer, record, e, scale):
    """{"A", "G"} of an Embedding particle layer (every token position is a location)."""
    one_hot, e = embedding_locations(layer, record.inputs, e)
    return {
        "A": input_factor(one_hot, False, int(layer.num_particles)),
        "G": gradient_factor(e, scale),
    }


def scale_shift_gradients(layer, normalized, e):
    """Per-example gradients (g_gamma, g_beta), each (B, N, C) or None when the layer has no such weight, of a
    BatchNormalization particle layer from its normalised input and its output gradient (same layout:
    images (B, H, W, N, C), else (B, N, ..., C)); sums over the locations."""
    n, channels = int(layer.num_particles), int(e.shape[-1])
    batch = tf.shape(e)[0]

    def locations(t):  # -> (B, N, L, C)
        if len(t.shape) == 5:
            return tf.transpose(tf.reshape(t, (batch, -1, n, channels)), [0, 2, 1, 3])
        return tf.reshape(t, (batch, n, -1, channels))

    e = locations(e)
    g_gamma = (
        tf.reduce_sum(e * locations(tf.cast(normalized, e.dtype)), 2)
        if layer.gamma is not None
        else None
    )
    g_beta = tf.reduce_sum(e, 2) if layer.beta is not None else None
    return g_gamma, g_beta


def batch_normalization_factors(layer, record, e, scale):
    """{"A_gamma", "G_gamma", "A_beta", "G_beta"} of a BatchNormalization particle layer (diagonal blocks)."""
    factors = {}
    for role, g in zip(("gamma", "beta"), scale_shift_gradients(layer, record.inputs, e)):
        if g is not None:
            squares = scale * tf.reduce_sum(tf.square(g), 0)  # (N, C)
            factors[f"A_{role}"] = tf.linalg.diag(squares)
            factors[f"G_{role}"] = tf.ones((int(layer.num_particles), 1, 1), squares.dtype)
    return factors


def recurrent_factors(layer, record, e, scale, reset_after=None):
    """The input and recurrent factors of a SimpleRNN or LSTM particle layer (the T time steps are the
    locations); a GRU's through `gru_factors`."""
    extras = record.extras or {}
    if "recurrent_inputs" not in extras:
        raise ValueError(
            f"KFAC: the record of recurrent layer '{layer.name}' has no recurrent inputs (h_(t-1))."
        )
    n, batch = int(layer.num_particles), tf.shape(e)[0]
    has_bias = getattr(layer, "bias", None) is not None
    units, width = int(layer.units), int(layer.kernel.shape[2])
    features = int(layer.kernel.shape[1])
    # A first layer's input is (B, T, F), one for all particles, unless input dropout gave it the N axis.
    x = tf.reshape(record.inputs, (batch, 1 if len(record.inputs.shape) == 3 else n, -1, features))
    e = tf.reshape(e, (batch, n, -1, width))
    h_prev = tf.reshape(extras["recurrent_inputs"], (batch, n, -1, units))
    factors = {"A_in": input_factor(x, has_bias, n), "G": gradient_factor(e, scale)}
    if reset_after:
        r = tf.reshape(extras["reset_gates"], (batch, n, -1, units))
        e_rec = tf.concat([e[..., : 2 * units], r * e[..., 2 * units :]], axis=-1)
        factors["A_rec"] = input_factor(h_prev, has_bias, n)
        factors["G_rec"] = gradient_factor(e_rec, scale)
    elif reset_after is False:
        factors["A_rec"] = input_factor(h_prev, False, n)
        factors["A_reset"] = input_factor(
            tf.reshape(extras["reset_recurrent_inputs"], (batch, n, -1, units)), False, n
        )
    else:
        factors["A_rec"] = input_factor(h_prev, False, n)
    return factors


def gru_factors(layer, record, e, scale):
    """The factors of a GRU particle layer: the input block's, and by `reset_after` (see the module docstring)
    the recurrent block's over the reset-gated output gradients, or the update / reset gates' and the
    candidate's over the reset-gated recurrent inputs."""
    return recurrent_factors(layer, record, e, scale, bool(layer.reset_after))


def _particle_major(t):
    """(B, M, L, d) -> (M, B*L, d): the rows of each particle (or of the shared input, M = 1) contiguous, so
    that a factor is one batched matmul (faster than the equivalent einsum, which TF lowers to a
    contraction over two axes with transposes of both operands)."""
    m = t.shape[1] if t.shape[1] is not None else tf.shape(t)[1]
    d = t.shape[-1] if t.shape[-1] is not None else tf.shape(t)[-1]
    return tf.reshape(tf.transpose(t, (1, 0, 2, 3)), [m, -1, d])


def input_factor(a, homogeneous, n):
    """a (B, N or 1, L, p) -> (N, p[+1], p[+1]): mean over the B*L rows of a~ a~^T, a~ = [a; 1]."""
    rows = tf.cast(tf.shape(a)[0] * tf.shape(a)[2], a.dtype)
    flat = _particle_major(a)  # (N|1, B*L, p)
    second = tf.matmul(flat, flat, transpose_a=True) / rows
    if homogeneous:
        first = tf.reduce_sum(flat, axis=1) / rows  # (N|1, p)
        top = tf.concat([second, first[:, :, None]], axis=2)
        bottom = tf.concat([first[:, None, :], tf.ones_like(first[:, :1])[:, None, :]], axis=2)
        second = tf.concat([top, bottom], axis=1)
    if second.shape[0] != n:
        second = tf.broadcast_to(second, (n,) + tuple(second.shape[1:]))
    return second


def gradient_factor(e, scale):
    """e (B, N, L, q) -> (N, q, q): dataset_scale * sum over the B*L rows of e e^T."""
    flat = _particle_major(e)
    return scale * tf.matmul(flat, flat, transpose_a=True)


def split_damping(a, g, lam, split=True):
    """(pi sqrt(lambda), sqrt(lambda) / pi) added to A and G (batched over leading axes).

    pi = sqrt((tr A / dim A) / (tr G / dim G)) (1 when a trace is not positive, clipped to [1e-8, 1e8])."""
    # lam: a number (exact in a's dtype, not rounded through float32) or a tensor
    root = tf.sqrt(tf.cast(lam, a.dtype) if tf.is_tensor(lam) else tf.constant(lam, a.dtype))
    if not split:
        one = tf.ones(tf.shape(a)[:-2], a.dtype)
        return root * one, root * one
    ta = tf.linalg.trace(a) / tf.cast(tf.shape(a)[-1], a.dtype)
    tg = tf.linalg.trace(g) / tf.cast(tf.shape(g)[-1], g.dtype)
    ok = (ta > 0) & (tg > 0)
    pi = tf.where(ok, tf.sqrt(tf.where(ok, ta, 1.0) / tf.where(ok, tg, 1.0)), tf.ones_like(ta))
    pi = tf.clip_by_value(pi, 1e-8, 1e8)
    return pi * root, root / pi


def conv_patches(layer, x):
    """Input patches of a particle Conv2D whose input is x, (B, H, W, N, C) (or a first layer's (B, H, W, C)):
    (B, N or 1, H'W', kh*kw*C) in the kernel's (kh, kw, C) order.

    The same values as tf.image.extract_patches (with the layer's strides, dilation and padding; 'same'
    pads as TF does, the odd pixel at the bottom / right), built by ONE gather of the padded images'
    pixels with a static index table. On small images the cost is per op, not per byte: the gather
    was faster than kh*kw strided slices + concat and than extract_patches on LeNet's 5x5 convolutions
    of 8x8 digits. Falls back to extract_patches when the spatial size is not static."""
    kh, kw = layer.kernel_size
    batch = tf.shape(x)[0]
    if layer.broadcasts:
        images = x
    else:  # (B, H, W, N, C) -> (B*N, H, W, C), each particle's images contiguous
        shape = tf.shape(x)
        images = tf.reshape(
            tf.transpose(x, [0, 3, 1, 2, 4]), tf.stack([-1, shape[1], shape[2], shape[4]])
        )
    height, width, channels = x.shape[1], x.shape[2], x.shape[-1]
    patches = None
    if height is not None and width is not None:
        sizes = []
        for size, k, s, d in (
            (height, kh, layer.strides[0], layer.dilation_rate[0]),
            (width, kw, layer.strides[1], layer.dilation_rate[1]),
        ):
            span = (k - 1) * d + 1
            if layer.padding == "same":
                out = -(-size // s)
                total = max((out - 1) * s + span - size, 0)
                pads = (total // 2, total - total // 2)
            else:
                out, pads = (size - span) // s + 1, (0, 0)
            sizes.append((out, pads, s, d))
        (out_h, pad_h, s_h, d_h), (out_w, pad_w, s_w, d_w) = sizes
        if out_h > 0 and out_w > 0:
            if any(pad_h + pad_w):
                images = tf.pad(images, [[0, 0], list(pad_h), list(pad_w), [0, 0]])
            padded_w = width + sum(pad_w)
            rows = (
                np.arange(out_h)[:, None, None, None] * s_h
                + np.arange(kh)[None, None, :, None] * d_h
            )
            cols = (
                np.arange(out_w)[None, :, None, None] * s_w
                + np.arange(kw)[None, None, None, :] * d_w
            )
            # [location][i][j] -> pixel of the padded image
            index = (rows * padded_w + cols).reshape(-1)
            pixels = tf.reshape(images, tf.stack([-1, (height + sum(pad_h)) * padded_w, channels]))
            patches = tf.reshape(
                tf.gather(pixels, index.astype(np.int32), axis=1),
                tf.stack([-1, out_h * out_w, kh * kw * channels]),
            )
    if patches is None:
        patches = tf.image.extract_patches(
            images,
            sizes=[1, kh, kw, 1],
            strides=[1, *layer.strides, 1],
            rates=[1, *layer.dilation_rate, 1],
            padding=layer.padding.upper(),
        )
    k = patches.shape[-1]
    return tf.reshape(patches, (batch, 1 if layer.broadcasts else layer.num_particles, -1, k))


# -- true Fisher ---------------------------------------------------------------------------------
def sampled_negative_log_likelihood(likelihood, outputs, seed=None):
    """-log p(y~_bn | x_b, w_n) (batch, N) for labels drawn from each particle's own predictive: the
    likelihood's own `sampled_negative_log_likelihood` (bayes_keras.likelihoods.Likelihood)."""
    if not isinstance(likelihood, Likelihood):
        raise ValueError(
            f"The true Fisher samples labels from a bayes_keras likelihood; {type(likelihood).__name__} "
            "is not supported. Use fisher='empirical'."
        )
    return likelihood.sampled_negative_log_likelihood(outputs, seed)
