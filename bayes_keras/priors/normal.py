"""Zero-mean (or shifted) Normal prior."""

import math

import keras
import tensorflow as tf

from bayes_keras._config import check_number
from bayes_keras.priors.prior import Prior


@keras.saving.register_keras_serializable(package="bayes_keras.priors")
class Normal(Prior):
    """Independent Normal prior N(loc, scale^2) on every weight.

    The default is the standard Normal N(0, 1) on every weight and bias (the prior of the GPF and
    SVGD papers' BNNs). `scale="he"` gives sqrt(2 / fan_in), the He initialisation scale, a much
    tighter prior that can dominate the likelihood of a small data set (on LeNet-5 / digits GPF then fell to
    chance accuracy: docs/architecture.md, "Priors").

    Args:
        loc: prior mean (float), default 0.
        scale: positive float, or "he" for sqrt(2 / fan_in), or "he:c" for c * sqrt(2 / fan_in).

    Example:
        >>> prior = bayes_keras.priors.Normal(scale=1.0)
        >>> layer = bayes_keras.layers.Dense(10, kernel_prior=prior)
    """

    def __init__(self, loc=0.0, scale=1.0):
        if isinstance(scale, str):
            if not (scale == "he" or scale.startswith("he:")):
                raise ValueError(
                    f"Normal prior scale must be a positive float or 'he'/'he:c'; got {scale!r}."
                )
            if scale.startswith("he:"):
                float(scale[3:])
        else:
            scale = check_number(scale, "Normal prior scale")
        self.loc = check_number(loc, "Normal prior loc", positive=False)
        self.scale = scale

    def stddev(self, fan_in):
        if isinstance(self.scale, str):
            factor = 1.0 if self.scale == "he" else float(self.scale[3:])
            return factor * math.sqrt(2.0 / max(int(fan_in), 1))
        return float(self.scale)

    def log_prob(self, value, fan_in):
        s = self.stddev(fan_in)
        z = (value - self.loc) / s
        return -0.5 * tf.square(z) - math.log(s) - 0.5 * math.log(2.0 * math.pi)

    def get_config(self):
        return {"loc": self.loc, "scale": self.scale}

    def __repr__(self):
        return f"Normal(loc={self.loc}, scale={self.scale!r})"
