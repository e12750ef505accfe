"""How a layer's Kronecker structure (`LayerSpec`) is found: from the layer's declared rules
(`kronecker_spec`) or from a set of particle variables alone (`candidate_specs`)."""

import numpy as np

from bayes_keras.curvature.kfac.blocks import KroneckerBlock, LayerSpec, Piece
from bayes_keras.curvature.kfac.batch_normalization import scale_shift_spec
from bayes_keras.curvature.kfac.embedding import embedding_table_spec
from bayes_keras.curvature.kinds import SUPPORTED_LAYERS, kronecker_rules


def kronecker_spec(layer):
    """The `LayerSpec` of a built bayes_keras particle layer (Dense, Conv2D, SimpleRNN, LSTM, GRU, or a
    layer whose class declares `curvature_rules` with a Kronecker spec).

    Raises:
        ValueError: for other layers, deterministic layers, and variables whose shapes do not match
            the layer's configuration.
    """
    rules = kronecker_rules(layer)
    if getattr(layer, "deterministic", False):
        raise ValueError(
            f"Layer '{layer.name}' is deterministic (shared weights): it has no particle curvature."
        )
    return rules.kronecker_spec(layer)


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
        return [embedding_table_spec(names["embeddings"][0])]
    if (
        names
        and set(names) <= {"gamma", "beta"}
        and all(len(vs) == 1 and len(vs[0].shape) == 2 for vs in names.values())
    ):
        return [scale_shift_spec(list(variables))]
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
        return [spec(kind, kernel, bias)]
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
        return [spec(kind, kernel, bias, recurrent, units)]
    if bias is not None:
        return [spec(kind, kernel, bias, recurrent, units, len(bias.shape) == 3)]
    return [
        spec(kind, kernel, None, recurrent, units, True),
        spec(kind, kernel, None, recurrent, units, False),
    ]


def spec(kind, kernel, bias, recurrent=None, units=None, reset_after=None, layer=None):
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
