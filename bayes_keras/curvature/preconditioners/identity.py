"""The trivial preconditioner Q = c I (matrix-valued SVGD then reduces to vanilla SVGD)."""

import keras
import numpy as np
import tensorflow as tf

from bayes_keras._config import is_real
from bayes_keras.curvature.preconditioners.base import Preconditioner
from bayes_keras.curvature.preconditioners.curvature import Curvature


class ScaledIdentityCurvature(Curvature):
    """Q_l = c I for every particle (diagonal: compatible with any grouping)."""

    blocks = None

    def __init__(self, num_particles, dims, scale, dtype):
        super().__init__(num_particles)
        self.dims, self.scale, self.dtype = list(dims), float(scale), dtype

    def _scaled(self, vs, c):
        return [None if v is None else c * v for v in vs]

    def apply(self, vs):
        return self._scaled(vs, self.scale)

    def solve(self, vs):
        return self._scaled(vs, 1.0 / self.scale)

    apply_mean = apply
    solve_mean = solve

    def log_det(self, indices=None):
        dim = sum(self.dims) if indices is None else sum(self.dims[i] for i in indices)
        return tf.fill((self.num_particles,), tf.constant(dim * np.log(self.scale), self.dtype))


@keras.saving.register_keras_serializable(package="bayes_keras")
class IdentityPreconditioner(Preconditioner):
    """Q = scale * I. MatrixSVGD with it is vanilla SVGD (up to the step scale 1 / scale).

    Args:
        scale: positive constant (default 1).
    """

    def __init__(self, scale=1.0):
        if not is_real(scale) or not np.isfinite(scale) or not scale > 0:
            raise ValueError(
                f"IdentityPreconditioner scale must be a positive number; got {scale!r}."
            )
        self.scale = float(scale)

    def update(self, particles, grads=None, records=(), step=None):
        return ScaledIdentityCurvature(
            particles[0].shape[0], [p.shape[-1] for p in particles], self.scale, particles[0].dtype
        )

    def get_config(self):
        return {"scale": self.scale}
