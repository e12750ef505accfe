"""The Kronecker structure of a layer: its blocks (`KroneckerBlock`, made of `Piece`s of its variables)
and the `LayerSpec` that the optimizer's state reads every step."""

import dataclasses


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
