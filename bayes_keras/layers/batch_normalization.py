"""BatchNormalization with per-particle batch statistics, moving averages, scale and offset."""

import contextlib
import threading

import keras
import tensorflow as tf

from bayes_keras.training import distribute
from bayes_keras import priors as priors_lib
from bayes_keras._config import check_number
from bayes_keras.saving.loaded_state import check_bounded_entry, remembered_refusal
from bayes_keras.curvature import capture, rules
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.particle_layout import (
    IMAGE_RANK,
    all_known,
    merge_particle_channels,
    particle_axis,
    per_particle_shape,
)

_BATCH_STATISTICS_PASS = threading.local()


@contextlib.contextmanager
def batch_statistics_pass(layers):
    """Inside the context (while a forward pass is traced or run eagerly), each of `layers` normalises
    with its batch's statistics whatever `training` says, leaves its moving statistics unchanged, and
    records its input x itself (not the normalised input) in the curvature capture: the one pass of
    `bayes_keras.training.batch_norm_refresh.refresh_batch_norm`. Other layers are unaffected."""
    previous = getattr(_BATCH_STATISTICS_PASS, "layers", None)
    _BATCH_STATISTICS_PASS.layers = {id(layer) for layer in layers}
    try:
        yield
    finally:
        _BATCH_STATISTICS_PASS.layers = previous


@keras.saving.register_keras_serializable(package="bayes_keras")
class BatchNormalization(ParticleLayer):
    """Batch normalization (Ioffe & Szegedy 2015, https://arxiv.org/abs/1502.03167, Algorithm 1) applied to each
    particle on its own: statistics over the batch (and spatial or time) axes of (batch, H, W, N, C) images or
    (batch, N, ..., C) inputs, never across the particle axis, so every particle is a network with its own BatchNormalization, as a
    per-particle loop of `keras.layers.BatchNormalization` computes (tested).

    Training (`training=True`, as `fit` calls it): y = (x - mean_b) / sqrt(var_b + epsilon) * gamma + beta with
    the batch's mean and (biased) variance per particle and channel, and the moving averages
    moving = momentum * moving + (1 - momentum) * batch statistic, per particle. Inference: the moving
    averages. A frozen layer (`trainable=False`) runs in inference mode even under `training=True`, as
    `keras.layers.BatchNormalization` does. In training on images the N particles' C channels are the N*C
    channels of one fused batch-norm op (float16, bfloat16 and float32 compute; float64 takes the unfused
    formula). gamma and beta are particle weights with priors (deterministic=True shares them); the
    moving statistics are always per particle (each particle's activations have their own).

    Further arguments:

    - momentum, epsilon, center, scale, moving_mean_initializer, moving_variance_initializer: as in
      `keras.layers.BatchNormalization`.
    - gamma_initializer, beta_initializer: default ones / zeros for a deterministic layer, and per particle
      plus N(0, 0.01^2) otherwise (particles equal on a coordinate would stay equal under GPF and SVGD).

    Args:
        axis: -1 (channels last; the only layout supported).
        gamma_prior: prior of the scale, default N(1, 1) (centred on the identity scale).
        beta_prior: prior of the offset, default N(0, 1).
        synchronized: under tf.distribute, normalise with the statistics of the GLOBAL batch (summed over
            replicas each step, as `keras.layers.BatchNormalization(synchronized=True)`), so that training
            equals one device's; default False (as Keras): each replica uses its own examples' statistics.
            Either way the moving averages are averaged over replicas, so every replica keeps the same ones.

    Other Parameters:
        deterministic: share gamma and beta between particles.

    Example:
        >>> h = bayes_keras.layers.Conv2D(16, 3, padding="same", num_particles=8)(inputs)
        >>> h = bayes_keras.layers.BatchNormalization()(h)          # (batch, H, W, 8, 16)
        >>> h = bayes_keras.layers.Activation("relu")(h)
    """

    # diagonal Fisher blocks for gamma, beta (curvature/kfac/batch_normalization.py)
    curvature_rules = rules.BATCH_NORMALIZATION

    def __init__(
        self,
        axis=-1,
        momentum=0.99,
        epsilon=1e-3,
        center=True,
        scale=True,
        beta_initializer=None,
        gamma_initializer=None,
        moving_mean_initializer="zeros",
        moving_variance_initializer="ones",
        gamma_prior=None,
        beta_prior=None,
        synchronized=False,
        **kwargs,
    ):
        kwargs.setdefault(
            "kernel_prior", gamma_prior if gamma_prior is not None else priors_lib.Normal(1.0, 1.0)
        )
        kwargs.setdefault("bias_prior", beta_prior)
        if kwargs.get("num_particles") is not None:
            raise ValueError(
                "BatchNormalization normalizes particle activations: place it after the layer where the "
                "particle axis begins (num_particles goes there)."
            )
        super().__init__(**kwargs)
        if axis not in (-1,):
            raise ValueError(
                f"BatchNormalization supports axis=-1 (channels last); got axis={axis!r}."
            )
        momentum = check_number(momentum, "BatchNormalization momentum", positive=False)
        epsilon = check_number(epsilon, "BatchNormalization epsilon")
        if not 0.0 <= momentum <= 1.0:  # (check_number has refused a non-positive epsilon)
            raise ValueError(
                f"BatchNormalization needs 0 <= momentum <= 1; got momentum={momentum!r}."
            )
        self.axis, self.momentum, self.epsilon = axis, momentum, epsilon
        self.center, self.scale = bool(center), bool(scale)
        if not isinstance(synchronized, bool):
            raise ValueError(
                f"BatchNormalization synchronized must be True or False; got {synchronized!r}."
            )
        self.synchronized = synchronized
        # Per particle, ones / zeros plus N(0, 0.01^2): particles equal on a coordinate stay equal under GPF's
        # affine flow and SVGD's kernel (as Dense's default bias initializer).
        spread = 0.0 if self.deterministic else 0.01
        self.beta_initializer = keras.initializers.get(
            beta_initializer
            if beta_initializer is not None
            else keras.initializers.RandomNormal(0.0, spread)
            if spread
            else "zeros"
        )
        self.gamma_initializer = keras.initializers.get(
            gamma_initializer
            if gamma_initializer is not None
            else keras.initializers.RandomNormal(1.0, spread)
            if spread
            else "ones"
        )
        self.moving_mean_initializer = keras.initializers.get(moving_mean_initializer)
        self.moving_variance_initializer = keras.initializers.get(moving_variance_initializer)
        self.supports_masking = True

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=len(input_shape) - 1)
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                f"BatchNormalization '{self.name}' needs a known channel dimension; got "
                f"{tuple(input_shape)}."
            )
        if len(input_shape) < 3:
            raise ValueError(
                f"BatchNormalization '{self.name}' expects (batch, particles, ..., channels) or images "
                f"(batch, H, W, particles, channels); got "
                f"{tuple(input_shape)}."
            )
        self.gamma = (
            self.add_particle_weight(
                "gamma", (channels,), self.gamma_initializer, self.kernel_prior, channels
            )
            if self.scale
            else None
        )
        self.beta = (
            self.add_particle_weight(
                "beta", (channels,), self.beta_initializer, self.bias_prior, channels
            )
            if self.center
            else None
        )
        n = self.num_particles
        self.moving_mean = self.add_weight(
            name="moving_mean",
            shape=(n, channels),
            initializer=self.moving_mean_initializer,
            trainable=False,
            aggregation="mean",
        )
        self.moving_variance = self.add_weight(
            name="moving_variance",
            shape=(n, channels),
            initializer=self.moving_variance_initializer,
            trainable=False,
            aggregation="mean",
        )

    def load_own_variables(self, store):
        """As every particle layer (finite entries), and a moving variance that is not negative (its square root
        normalises every inference input)."""
        super().load_own_variables(store)
        with remembered_refusal(self, store):
            check_bounded_entry(self.name, self.moving_variance, "layer", "moving variance")

    def _per_particle(self, value, rank):
        """(N, C) -> a shape that broadcasts against the input of `rank`; shared (C,) broadcasts as it is."""
        if len(value.shape) == 1:
            return value
        return tf.reshape(value, per_particle_shape(rank, self.num_particles, value.shape[-1]))

    def _update_moving(self, mean, variance):
        for moving, batch in ((self.moving_mean, mean), (self.moving_variance, variance)):
            moving.assign(
                moving * self.momentum + tf.cast(batch, moving.dtype) * (1.0 - self.momentum)
            )

    def _channel_blocks(self, value):
        """gamma / beta as the N*C channels of the (B, H, W, N*C) view: (N, C) flattened, shared (C,) tiled."""
        value = tf.cast(value, tf.float32)
        return (
            tf.reshape(value, (-1,))
            if len(value.shape) == 2
            else tf.tile(value, [self.num_particles])
        )

    def _fused_image(self, x):
        """Training on images (B, H, W, N, C): one FusedBatchNorm over the N*C channels of the (B, H, W, N*C) view."""
        n, c = self.num_particles, x.shape[-1]
        shape = tuple(x.shape) if all_known(x.shape) else tf.shape(x)
        grouped = merge_particle_channels(x, n)
        scale = (
            self._channel_blocks(self.gamma)
            if self.gamma is not None
            else tf.ones((n * c,), tf.float32)
        )
        offset = (
            self._channel_blocks(self.beta)
            if self.beta is not None
            else tf.zeros((n * c,), tf.float32)
        )
        y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            grouped, scale, offset, epsilon=self.epsilon, is_training=True
        )
        # The op returns the unbiased variance; Keras' moving variance averages the biased one.
        count = tf.cast(shape[0] * shape[1] * shape[2], tf.float32)
        variance = variance * (count - 1.0) / tf.maximum(count, 1.0)
        self._update_moving(tf.reshape(mean, (n, c)), tf.reshape(variance, (n, c)))
        y = tf.reshape(y, shape)
        # the normalised input (biased batch variance, as the op normalises with)
        if capture.is_capturing():
            normalized = (grouped - mean) * tf.math.rsqrt(variance + self.epsilon)
            capture.record(self, tf.stop_gradient(tf.reshape(normalized, shape)), y)
        return y

    def call(self, inputs, training=None, mask=None):
        x = tf.convert_to_tensor(inputs)
        # batch statistics, no update
        refresh = id(self) in (getattr(_BATCH_STATISTICS_PASS, "layers", None) or ())
        # a frozen layer uses its moving statistics (as Keras')
        training = (training or refresh) and self.trainable
        rank = len(x.shape)
        compute = x.dtype
        # (particle parallel: every replica normalises its own particles over the whole batch already)
        synchronized = (
            training
            and self.synchronized
            and distribute.num_replicas() > 1
            and distribute.particle_slice_of(self) is None
            and not refresh
        )
        if (
            training
            and rank == IMAGE_RANK
            and compute in (tf.float16, tf.bfloat16, tf.float32)
            and not synchronized
            and not refresh
        ):
            # Training only: in inference Grappler folds a FusedBatchNorm that follows a convolution into
            # a _FusedConv2D, whose Eigen CPU kernel refuses grouped convolutions (TF_ENABLE_ONEDNN_OPTS=0).
            return self._fused_image(x)
        # statistics in float32
        x32 = tf.cast(x, tf.float32) if compute in (tf.float16, tf.bfloat16) else x
        if training:
            axes = [a for a in range(rank - 1) if a != particle_axis(rank)]
            if synchronized:
                mean, variance = _global_moments(x32, axes)
            else:
                mean, variance = tf.nn.moments(x32, axes=axes)  # (N, C), biased variance as Keras'
            if not refresh:
                self._update_moving(mean, variance)
        else:
            mean = tf.cast(self.moving_mean, x32.dtype)
            variance = tf.cast(self.moving_variance, x32.dtype)
        y = (x32 - self._per_particle(mean, rank)) * tf.math.rsqrt(
            self._per_particle(variance, rank) + self.epsilon
        )
        normalized = y
        if self.gamma is not None:
            y = y * self._per_particle(tf.cast(self.gamma, y.dtype), rank)
        if self.beta is not None:
            y = y + self._per_particle(tf.cast(self.beta, y.dtype), rank)
        y = tf.cast(y, compute)
        if capture.is_capturing():
            capture.record(self, tf.stop_gradient(x32 if refresh else normalized), y)
        return y

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "axis": self.axis,
                "momentum": self.momentum,
                "epsilon": self.epsilon,
                "center": self.center,
                "scale": self.scale,
                "beta_initializer": keras.initializers.serialize(self.beta_initializer),
                "gamma_initializer": keras.initializers.serialize(self.gamma_initializer),
                "moving_mean_initializer": keras.initializers.serialize(
                    self.moving_mean_initializer
                ),
                "moving_variance_initializer": keras.initializers.serialize(
                    self.moving_variance_initializer
                ),
                "synchronized": self.synchronized,
            }
        )
        config.pop("num_particles", None)
        return config


def _global_moments(x, axes):
    """Mean and biased variance over `axes` of the examples of every replica (sums all-reduced; the
    all-reduce is differentiable, so gradients flow to every replica's examples, as on one device)."""
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
    total, squares, count = distribute.sum_across_replicas(
        [tf.reduce_sum(x, axis=axes), tf.reduce_sum(tf.square(x), axis=axes), count]
    )
    mean = total / count
    return mean, tf.maximum(squares / count - tf.square(mean), 0.0)
