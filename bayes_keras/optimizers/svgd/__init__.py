"""Stein variational gradient descent: SVGD (scalar kernels) and MatrixSVGD (matrix-valued kernels).

`svgd.py` holds SVGD's direction and its Keras optimizer; `stein.py` the matrix-valued kernels'
directions as pure tensor functions, and `matrix_svgd.py` the Keras optimizer that calls them. The
kernels are bayes_keras.kernels; MatrixSVGD's curvature comes from a preconditioner object,
bayes_keras.preconditioners (the package bayes_keras/curvature/preconditioners).
Both optimizers derive from bayes_keras.core.ParticleOptimizer, which splits the gradients, calls
`direction` (SVGD) or `update_particles` (MatrixSVGD) and steps with the step rule.
"""

from bayes_keras.optimizers.svgd.matrix_svgd import MatrixSVGD
from bayes_keras.optimizers.svgd.svgd import SVGD

__all__ = ["SVGD", "MatrixSVGD"]
