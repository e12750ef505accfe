"""ParticleLayer: the base of every layer that holds weights with a leading particle axis.

A layer built with `num_particles=N` is where the particle axis begins: it takes an ordinary (batch, ...)
input. Every other particle layer reads N from its input's particle axis (the activations' layout:
`bayes_keras.layers.particle_layout`). Weights are (N, ...) stacks, one slice per particle, unless the
layer is `deterministic`, in which case one weight set is shared by all particles (a point estimate with
its prior: MAP).
"""

import weakref
from typing import NamedTuple

import keras
import tensorflow as tf

from bayes_keras import priors as priors_lib
from bayes_keras.layers.particle_initializers import DRAW_HEADROOM, particle_initializer
from bayes_keras.layers.particle_layout import IMAGE_RANK, particle_axis
from bayes_keras.saving.loaded_state import check_finite_entries, remembered_refusal
from bayes_keras.training.memory_guard import check_fits, tensor_bytes


class ParticleTerm(NamedTuple):
    """Attached to each particle variable as `variable.particle_term`: the layer that owns it (a weak
    reference), its prior and the fan-in the prior's scale is computed from."""

    layer: weakref.ref
    prior: object
    fan_in: int


class ParticleLayer(keras.layers.Layer):
    """Base class for layers whose weights carry a leading particle axis.

    Further arguments:

    - kernel_prior, bias_prior: `bayes_keras.priors.Prior` objects (or a float scale for a
      zero-mean Normal). Default: Normal(0, 1) for kernels and biases (see priors.Normal).

    Args:
        num_particles: give this only on the layer where the particle axis begins (the first
            Bayesian layer): its input is an ordinary (batch, ...) tensor and its output is
            (batch, num_particles, ...), or (batch, H, W, num_particles, channels) for images. Leave it
            None on every later layer: they read N from their input's particle axis.
        deterministic: if True the layer's weights are shared by all particles (no particle axis
            on the weights), as in hybrid networks where only some layers are Bayesian.

    A subclass that curvature-based methods (KFAC, MGVBP's Fisher curvatures) should support declares
    its formulas as the class attribute `curvature_rules` (a `bayes_keras.curvature.kinds.LayerCurvature`).
    """

    curvature_rules = None  # no curvature formulas (bayes_keras.curvature.kinds)

    def __init__(
        self, num_particles=None, deterministic=False, kernel_prior=None, bias_prior=None, **kwargs
    ):
        super().__init__(**kwargs)
        if num_particles is not None:
            if (
                isinstance(num_particles, bool)
                or not isinstance(num_particles, int)
                or num_particles < 1
            ):
                raise ValueError(
                    f"num_particles must be a positive integer or None; got {num_particles!r}."
                )
        self._given_num_particles = num_particles
        self.num_particles = num_particles
        self.deterministic = bool(deterministic)
        self.kernel_prior = priors_lib.get(kernel_prior)
        self.bias_prior = priors_lib.get(bias_prior)
        self._prior_terms = []  # (variable, prior, fan_in)

    # -- particle axis -------------------------------------------------------------------------
    @property
    def broadcasts(self):
        """True when this layer starts the particle axis (its input has none)."""
        return self._given_num_particles is not None

    def _resolve_num_particles(self, input_shape, core_rank):
        """Set self.num_particles from the input shape; `core_rank` is the rank without particle axis."""
        rank = len(input_shape)
        name = type(self).__name__
        if self.broadcasts:
            if rank != core_rank:
                raise ValueError(
                    f"{name} '{self.name}' was given num_particles={self._given_num_particles}, so it "
                    f"expects an ordinary input of rank {core_rank} (batch, ...); got shape {tuple(input_shape)}. "
                    "Give num_particles only to the layer where the particle axis begins."
                )
            return
        axis = particle_axis(core_rank + 1)
        if rank != core_rank + 1 or input_shape[axis] is None:
            layout = (
                "(batch, H, W, particles, channels)"
                if core_rank + 1 == IMAGE_RANK
                else "(batch, particles, ...)"
            )
            raise ValueError(
                f"{name} '{self.name}' expects input {layout} of rank {core_rank + 1} from a "
                f"previous particle layer; got shape {tuple(input_shape)}. If this is the first Bayesian "
                "layer of the model, pass num_particles=N to it."
            )
        self.num_particles = int(input_shape[axis])

    def load_own_variables(self, store):
        """Keras' loading, then a check that no loaded weight is NaN / Inf (the entry is named)."""
        with remembered_refusal(self, store):
            super().load_own_variables(store)
            check_finite_entries(self.name, self.weights, "layer")

    # -- weights -------------------------------------------------------------------------------
    def add_particle_weight(self, name, shape, initializer, prior, fan_in):
        """Create an (N, *shape) weight (or a shared `shape` weight when deterministic) with a prior."""
        if self.deterministic:
            variable = self.add_weight(name=name, shape=tuple(shape), initializer=initializer)
        else:
            # This weight and the layer's earlier ones together, times DRAW_HEADROOM: drawing the initial values
            # holds the random draw, the variable and the initializer's intermediates at once.
            nbytes = tensor_bytes((self.num_particles,) + tuple(shape), self.variable_dtype)
            total = nbytes + sum(
                tensor_bytes(v.shape, v.dtype)
                for v, _, _ in self._prior_terms
                if getattr(v, "is_particle_variable", False)
            )
            check_fits(
                DRAW_HEADROOM * total,
                f"{type(self).__name__} '{self.name}': its {name} for {self.num_particles} particles, shape "
                f"{(self.num_particles,) + tuple(shape)}, with the layer's other weights and the initial draw,",
                "Use fewer particles or a smaller layer.",
            )
            variable = self.add_weight(
                name=name,
                shape=(self.num_particles,) + tuple(shape),
                initializer=particle_initializer(initializer, self.num_particles),
            )
            variable.is_particle_variable = True
            # What an optimizer needs to know of this variable, readable from the variable alone (a
            # ParticleView is built from the variables an optimizer is handed; docs/architecture.md).
            variable.particle_term = ParticleTerm(weakref.ref(self), prior, int(fan_in))
        self._prior_terms.append((variable, prior, int(fan_in)))
        return variable

    @property
    def prior_terms(self):
        """(variable, prior, fan_in) for each of this layer's weights, in creation order."""
        return list(self._prior_terms)

    @property
    def particle_variables(self):
        """The (N, ...) weights of this layer (empty when deterministic)."""
        return [] if self.deterministic else [v for v, _, _ in self._prior_terms]

    def log_prior(self):
        """Log prior density: shape (N,) for a particle layer, a scalar for a deterministic one."""
        total = 0.0
        for variable, prior, fan_in in self._prior_terms:
            lp = prior.log_prob(variable.value, fan_in)
            if self.deterministic:
                total += tf.reduce_sum(lp)
            else:
                total += tf.reduce_sum(tf.reshape(lp, (self.num_particles, -1)), axis=1)
        return total

    def _broadcast_shared(self, y):
        """Insert the particle axis into a shared (batch, ...) result when this layer starts it."""
        if not self.broadcasts:
            return y
        axis = particle_axis(len(y.shape) + 1)
        y = tf.expand_dims(y, axis)
        multiples = [1] * len(y.shape)
        multiples[axis] = self._given_num_particles
        return tf.tile(y, multiples)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_particles": self._given_num_particles,
                "deterministic": self.deterministic,
                "kernel_prior": priors_lib.serialize(self.kernel_prior),
                "bias_prior": priors_lib.serialize(self.bias_prior),
            }
        )
        return config
