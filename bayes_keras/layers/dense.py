"""Dense layer with one weight set per particle."""

import keras
import tensorflow as tf

from bayes_keras.curvature import capture
from bayes_keras.curvature import rules
from bayes_keras.layers._permute import permute
from bayes_keras.layers.particle_initializers import default_bias_initializer
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.particle_layout import IMAGE_RANK


@keras.saving.register_keras_serializable(package="bayes_keras")
class Dense(ParticleLayer):
    """Densely connected layer whose kernel is an (N, in, out) stack of particles.

    All N weight sets are applied in one batched matmul: (batch, N, ..., in) -> (batch, N, ..., out).

    Further arguments:

    - activation, use_bias, kernel_initializer: as in `keras.layers.Dense` (each particle is
      initialised independently).
    - num_particles, deterministic, kernel_prior, bias_prior: see `ParticleLayer`.

    Args:
        units: output size.
        bias_initializer: default zeros for a deterministic layer and N(0, 0.01^2) per particle
            otherwise: particles that agree exactly on a coordinate stay equal under GPF's affine
            flow (and SVGD's kernel), so a zero bias for all particles would never spread.

    Example:
        >>> inputs = keras.Input((30,))
        >>> h = bayes_keras.layers.Dense(50, activation="relu", num_particles=10)(inputs)
        >>> logits = bayes_keras.layers.Dense(2)(h)          # (batch, 10, 2)
    """

    curvature_rules = rules.DENSE  # KFAC and squared-gradient formulas (curvature/rules.py)

    def __init__(
        self,
        units,
        activation=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ValueError(f"Dense units must be a positive integer; got {units!r}.")
        self.units = units
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(
            default_bias_initializer(bias_initializer, self.deterministic)
        )
        self.image = False

    def build(self, input_shape):
        # Core rank 2 = (batch, features); a particle input is (batch, N, features). Extra middle
        # axes (e.g. time) are allowed, as in keras.layers.Dense.
        rank = len(input_shape)
        if rank + (1 if self.broadcasts else 0) > IMAGE_RANK:
            raise ValueError(
                f"Dense '{self.name}' takes (batch, [particles,] features), (batch, [particles,] time, features) or "
                f"images (batch, H, W, [particles,] channels); got shape {tuple(input_shape)}."
            )
        # a per-pixel Dense on images (ConvNeXt's pointwise layers): (B, H, W, N, C), without curvature formulas
        self.image = rank + (1 if self.broadcasts else 0) == IMAGE_RANK
        if self.image:
            self.curvature_rules = None
        core_rank = rank if self.broadcasts else max(rank - 1, 2)
        self._resolve_num_particles(input_shape, core_rank)
        in_dim = input_shape[-1]
        if in_dim is None:
            raise ValueError(
                f"Dense '{self.name}' needs a known last input dimension; got {tuple(input_shape)}."
            )
        self.kernel = self.add_particle_weight(
            "kernel",
            (in_dim, self.units),
            self.kernel_initializer,
            self.kernel_prior,
            fan_in=in_dim,
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_particle_weight(
                "bias", (self.units,), self.bias_initializer, self.bias_prior, fan_in=in_dim
            )
        # Keras checks every later call against the features the weights were built for (a model rebuilt
        # from a config whose Input was changed is refused naming this layer, as keras.layers.Dense does).
        self.input_spec = keras.InputSpec(min_ndim=2, axes={-1: in_dim})

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs)
        if self.deterministic:
            y = tf.tensordot(x, self.kernel, axes=[[-1], [0]])
            if self.bias is not None:
                y = y + self.bias
            return self.activation(self._broadcast_shared(y))
        n = self.num_particles
        if self.image:
            return self._image_call(x, n)
        if self.broadcasts and len(x.shape) == 2:
            # (batch, in) @ (in, N out): one matmul against the concatenated kernels, whose column
            # blocks are the particles, so the result is already (batch, N, out) after a reshape.
            k = tf.reshape(permute(self.kernel, [1, 0, 2]), (-1, n * self.units))
            y = tf.reshape(tf.matmul(x, k), (-1, n, self.units))
        elif self.broadcasts:
            k = tf.reshape(permute(self.kernel, [1, 0, 2]), (-1, n * self.units))
            y = tf.tensordot(x, k, axes=[[-1], [0]])
            y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [n, self.units]], 0))
            y = tf.experimental.numpy.moveaxis(y, -2, 1)
        elif len(x.shape) == 3 and not capture.is_capturing():
            # (batch, N, in): the particle axis as the matmul batch axis. Bias and activation are applied
            # particle-major, before the transpose back: between two Dense layers the graph then holds
            # transpose(transpose(h)), which Grappler removes, forward and backward.
            y = tf.matmul(tf.transpose(x, [1, 0, 2]), self.kernel)
            if self.bias is not None:
                y = y + self.bias[:, None, :]
            return tf.transpose(self.activation(y), [1, 0, 2])
        elif len(x.shape) == 3:
            y = tf.transpose(tf.matmul(tf.transpose(x, [1, 0, 2]), self.kernel), [1, 0, 2])
        else:
            # Particle axis as the matmul batch axis: (N, batch*..., in) @ (N, in, out).
            shape = tf.shape(x)
            xt = tf.experimental.numpy.moveaxis(x, 1, 0)
            xt = tf.reshape(xt, (n, -1, shape[-1]))
            y = tf.matmul(xt, self.kernel)
            y = tf.reshape(y, tf.concat([[n, shape[0]], shape[2:-1], [self.units]], 0))
            y = tf.experimental.numpy.moveaxis(y, 0, 1)
        if self.bias is not None:
            bshape = [1, n] + [1] * (len(y.shape) - 3) + [self.units]
            y = y + tf.reshape(self.bias, bshape)
        capture.record(self, x, y)
        return self.activation(y)

    def _image_call(self, x, n):
        """Per-pixel Dense of images: (B, H, W, C) shared by the particles, or (B, H, W, N, C) -> (B, H, W, N, units)."""
        if self.broadcasts:
            k = tf.reshape(permute(self.kernel, [1, 0, 2]), (-1, n * self.units))
            y = tf.tensordot(x, k, axes=[[-1], [0]])
            y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [n, self.units]], 0))
        else:
            y = tf.einsum("bhwni,nio->bhwno", x, self.kernel)
        if self.bias is not None:
            y = y + self.bias  # (N, units) broadcasts over (B, H, W, N, units)
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        if self.broadcasts and len(shape) + 1 == IMAGE_RANK:
            return tuple(shape[:-1] + [self._given_num_particles, self.units])
        if self.broadcasts:
            shape = shape[:1] + [self._given_num_particles] + shape[1:]
        return tuple(shape[:-1] + [self.units])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
