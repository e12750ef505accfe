"""One layer's KFAC state: its running factors, damped factors and inverses, and how its captured
statistics map onto them (used by KFACPreconditioner, kfac_preconditioner.py)."""

import dataclasses
import weakref

import numpy as np
import tensorflow as tf

from bayes_keras.curvature import kfac as kfac_lib


@dataclasses.dataclass
class KroneckerOperator:
    """One Kronecker block's tensors for one step (read from the preconditioner's variables).

    pieces: ((variable index, row start, row count), ...); columns: (c0, c1); p, q: the block's
    matrix shape. a, g, a_inv, g_inv: (N, p, p) / (N, q, q) damped factors and inverses; log_det: (N,)
    log det(A (x) G) = q log det A + p log det G; a_mean, ...: the same for Q_bar, (p, p) / (q, q).
    The per-particle or the mean tensors are None when the preconditioner does not compute them (its
    optimizer's `curvature_operators`).
    """

    pieces: tuple
    columns: tuple
    p: int
    q: int
    a: tf.Tensor
    g: tf.Tensor
    a_inv: tf.Tensor
    g_inv: tf.Tensor
    log_det: tf.Tensor
    a_mean: tf.Tensor
    g_mean: tf.Tensor
    a_mean_inv: tf.Tensor
    g_mean_inv: tf.Tensor

    def pair(self, which):
        left, right = {
            "apply": (self.a, self.g),
            "solve": (self.a_inv, self.g_inv),
            "apply_mean": (self.a_mean, self.g_mean),
            "solve_mean": (self.a_mean_inv, self.g_mean_inv),
        }[which]
        if left is None:
            raise ValueError(not_declared(which))
        return left, right


def not_declared(which):
    return (
        f"This KFAC curvature does not hold what {which}() needs: its optimizer's curvature_operators did not "
        f"declare {which!r}, so the preconditioner never computed it (see "
        "bayes_keras.curvature.preconditioners.kfac_preconditioner: 'What is inverted')."
    )


class KFACLayerState:
    """The KFAC variables of one layer (variable group) and the structure that maps its record onto them.

    Args:
        add_variable: creates the variables (the optimizer's `add_variable`).
        variables: the layer's particle variables (N, ...).
        indices: their positions among the optimizer's particle variables.
        priors: their (prior, fan_in) pairs, from the optimizer's ParticleView.
        shapes: (N, size) of every particle variable of the optimizer (checked against the views).
    """

    def __init__(self, add_variable, variables, indices, priors, shapes):
        # Two candidates only for a GRU without bias, whose reset_after the variables cannot tell.
        self.candidates = kfac_lib.candidate_specs(variables)  # raises for unsupported layers
        self.spec = self.candidates[0]
        self.index = {id(v): i for v, i in zip(variables, indices)}
        self.priors = {id(v): p for v, p in zip(variables, priors)}
        n = shapes[indices[0]][0]
        self.views = {}
        for v, matrix in self.spec.views:
            i = self.index[id(v)]
            if int(np.prod(matrix)) != shapes[i][1] or shapes[i][0] != n:
                raise ValueError(
                    f"KFACPreconditioner: variable {v.path} is {matrix} per particle but the "
                    f"optimizer's particles have shape {shapes[i]}."
                )
            self.views[i] = matrix
        self.order = [self.index[id(v)] for v, _ in self.spec.views]
        self.num_particles = n
        self.prior = {}
        self._layer = None  # the captured layer, once a step has checked it (resolve)
        self.factors, self.blocks = self._make_variables(add_variable, n)

    def _make_variables(self, add, n):
        """Variables for the union of the candidates' factors and blocks. All of them, whatever is computed:
        the optimizer's variable layout (and so saved models) does not depend on the consumer; those not
        computed keep their initial identity / zero values."""
        base = _clean(self.candidates[0].variables[0].path.rsplit("/", 1)[0])
        factors, blocks = {}, {}
        for spec in self.candidates:
            for name, d in spec.factor_dims.items():
                if name not in factors:
                    factors[name] = add((n, d, d), initializer="zeros", name=f"kfac_{base}_{name}")
            for block in spec.blocks:
                if block.role in blocks:
                    continue
                p, q = spec.block_shape(block)
                tag = f"kfac_{base}_{block.role}"
                blocks[block.role] = {"p": p, "q": q}
                for key, shape, init, suffix in (
                    ("a", (n, p, p), _identity(p), "a_damped"),
                    ("g", (n, q, q), _identity(q), "g_damped"),
                    ("a_inv", (n, p, p), _identity(p), "a_inverse"),
                    ("g_inv", (n, q, q), _identity(q), "g_inverse"),
                    ("log_det", (n,), "zeros", "log_det"),
                    ("a_mean", (p, p), _identity(p), "a_mean_damped"),
                    ("g_mean", (q, q), _identity(q), "g_mean_damped"),
                    ("a_mean_inv", (p, p), _identity(p), "a_mean_inverse"),
                    ("g_mean_inv", (q, q), _identity(q), "g_mean_inverse"),
                ):
                    blocks[block.role][key] = add(shape, initializer=init, name=f"{tag}_{suffix}")
        return factors, blocks

    def resolve(self, records):
        """This layer's record among a step's records. The first step checks the captured layer against
        the structure its variables suggested at build and computes the blocks' prior precisions; later
        steps find the record by its layer (setup once, as an optimizer builds once)."""
        layer = None if self._layer is None else self._layer()
        if layer is not None:
            found = [r for r in records if r.layer is layer]
            if len(found) == 1:
                return found[0]
        variables = self.candidates[0].variables
        found = [
            r
            for r in records
            if _same_variables(getattr(r.layer, "particle_variables", ()), variables)
        ]
        where = ", ".join(v.path for v in variables)
        if not found:
            raise ValueError(
                f"KFACPreconditioner: no curvature was captured for the layer of [{where}] in this "
                "step (KFAC supports the particle layers "
                + ", ".join(kfac_lib.SUPPORTED_LAYERS)
                + "; is the layer part of the model being trained?)."
            )
        if len(found) > 1:
            raise ValueError(
                f"KFACPreconditioner: layer '{found[0].layer.name}' was called {len(found)} times in "
                "one forward pass; KFAC supports layers applied once per step."
            )
        layer = found[0].layer
        actual = kfac_lib.kronecker_spec(layer)  # raises for unsupported layers
        if not any(c.same_structure(actual) for c in self.candidates):
            raise ValueError(
                f"KFACPreconditioner: layer '{layer.name}' ({actual.kind}) does not match the "
                f"structure its variables [{where}] suggested at build time "
                f"({self.candidates[0].kind})."
            )
        self.spec = actual
        for block in actual.blocks:
            self.prior[block.role] = self._prior_precision(block, actual.block_shape(block)[1])
        self._layer = weakref.ref(layer)
        return found[0]

    def _prior_precision(self, block, q):
        """Coordinate-weighted mean prior precision 1 / s^2 over a block's weights (0 without stddev)."""
        total, count = 0.0, 0
        for piece in block.pieces:
            precision = 0.0
            prior, fan_in = self.priors.get(id(piece.variable), (None, None))
            if hasattr(prior, "stddev"):
                precision = 1.0 / float(prior.stddev(fan_in)) ** 2
            total += precision * piece.row_count * q
            count += piece.row_count * q
        return total / max(count, 1)

    def batch_factors(self, record, fisher):
        """{factor name: (N, d, d)} of this batch, shape-checked."""
        factors = kfac_lib.kfac_factors(record, fisher)
        for name, d in self.spec.factor_dims.items():
            shape = tuple(factors[name].shape)
            if shape != (self.num_particles, d, d):
                raise ValueError(
                    f"KFACPreconditioner: factor {name} of layer '{record.layer.name}' has shape "
                    f"{shape}, expected {(self.num_particles, d, d)}."
                )
        return factors

    def accumulate(self, factors, rho64):
        """Running average F <- rho F + (1 - rho) F_batch of every factor."""
        for name in factors:
            variable = self.factors[name]
            rho = tf.cast(rho64, variable.dtype)
            variable.assign(
                rho * variable.value + (1.0 - rho) * tf.cast(factors[name], variable.dtype)
            )

    def invert(self, damping_for, per_particle, mean, split):
        """Damped factors, inverses and log-determinants of every block from the running factors;
        `damping_for(role)` is the block's lambda."""
        for block in self.spec.blocks:
            b = self.blocks[block.role]
            a = tf.cast(self.factors[block.a].value, tf.float64)
            g = tf.cast(self.factors[block.g].value, tf.float64)
            if block.columns is not None:
                c0, c1 = block.columns
                g = g[:, c0:c1, c0:c1]
            lam = damping_for(block.role)
            if per_particle:
                a_d, a_inv, a_logdet, g_d, g_inv, g_logdet = damped_inverses(a, g, lam, split)
                _assign(
                    b,
                    a=a_d,
                    g=g_d,
                    a_inv=a_inv,
                    g_inv=g_inv,
                    log_det=b["q"] * a_logdet + b["p"] * g_logdet,
                )
            if mean:
                am_d, am_inv, _, gm_d, gm_inv, _ = damped_inverses(
                    tf.reduce_mean(a, 0), tf.reduce_mean(g, 0), lam, split
                )
                _assign(b, a_mean=am_d, g_mean=gm_d, a_mean_inv=am_inv, g_mean_inv=gm_inv)

    def operators(self, per_particle, mean):
        """The current `KroneckerOperator` of every block (None for what is not computed)."""
        ops = []
        for block in self.spec.blocks:
            b = self.blocks[block.role]
            pieces = tuple(
                (self.index[id(pc.variable)], pc.row_start, pc.row_count) for pc in block.pieces
            )
            columns = block.columns or (0, self.spec.view(block.pieces[0].variable)[1])
            values = {
                k: (b[k].value if per_particle else None)
                for k in ("a", "g", "a_inv", "g_inv", "log_det")
            }
            values.update(
                {
                    k: (b[k].value if mean else None)
                    for k in ("a_mean", "g_mean", "a_mean_inv", "g_mean_inv")
                }
            )
            ops.append(KroneckerOperator(pieces, columns, b["p"], b["q"], **values))
        return ops


def damped_inverses(a, g, lam, split=True):
    """Damped factors, their inverses and log-determinants (symmetrised, eigendecomposition).

    Returns (A_d, A_d^-1, log det A_d, G_d, G_d^-1, log det G_d); A_d = A + c_A I, G_d = G + c_G I with
    (c_A, c_G) from `bayes_keras.curvature.kfac.split_damping`. Eigenvalues are floored at c (exact for PSD A, G)."""
    c_a, c_g = kfac_lib.split_damping(a, g, lam, split)
    out = []
    for m, c in ((a, c_a), (g, c_g)):
        m = 0.5 * (m + tf.linalg.matrix_transpose(m))
        eye = tf.eye(tf.shape(m)[-1], dtype=m.dtype)
        m_d = m + c[..., None, None] * eye
        vals, vecs = tf.linalg.eigh(m_d)
        vals = tf.maximum(vals, c[..., None])
        inv = tf.matmul(vecs / vals[..., None, :], vecs, transpose_b=True)
        out += [m_d, inv, tf.reduce_sum(tf.math.log(vals), axis=-1)]
    return tuple(out)


def _assign(block, **values):
    for name, value in values.items():
        block[name].assign(tf.cast(value, block[name].dtype))


def _clean(path):
    return "".join(c if c.isalnum() or c == "_" else "_" for c in path)


def _same_variables(a, b):
    a, b = list(a), list(b)
    return len(a) == len(b) and all(any(x is y for y in b) for x in a)


def _identity(d):
    def init(shape, dtype=None):
        eye = np.eye(d, dtype=np.float32)
        return tf.constant(np.broadcast_to(eye, shape).copy(), dtype=dtype or "float32")

    return init
