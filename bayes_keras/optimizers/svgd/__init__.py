"""Stein variational gradient descent: SVGD (scalar kernels) and MatrixSVGD (matrix-valued kernels).

`stein.py` holds both methods' directions as pure tensor functions; `svgd.py` and `matrix_svgd.py` the
Keras optimizers that call them. The kernels are bayes_keras.kernels.
"""

from bayes_keras.optimizers.svgd.matrix_svgd import MatrixSVGD
from bayes_keras.optimizers.svgd.svgd import SVGD

__all__ = ["SVGD", "MatrixSVGD"]
