"""GaussianFamily: the interface of one block of an explicit Gaussian posterior."""

import tensorflow as tf


def current(variable):
    """Read a state variable's current value (the default `read` of the families' methods)."""
    return variable.value


class GaussianFamily:
    """One block of q = N(mu, P^-1) over `dim` flattened weights, its state kept in optimizer variables.

    A family implements:
        variables(add_variable, prefix) -> {name: variable}: the block's state ("mean", "m_mean", ...),
            created through the optimizer's `add_variable(shape, name)` (saved with the model).
        initialize(state, mean, initial_precision): q = N(mean, I / initial_precision).
        sample(state, eps, read) -> (rows, dim): mu + P^{-1/2} eps for standard normals eps (rows, dim).
        entropy(state), distribution(state), marginal(state, offset, size): H(q), q and the marginal of
            a contiguous range of coordinates as TFP distributions.
    and a `step` whose arguments depend on how its curvature is estimated (see each family).
    `read(variable)` gives the value a method should use: the current one, or one an update has just
    computed (StateWrites.read), so that the new particles are samples of the new q.

    Args:
        dim: number of weights in the block.
        dtype: dtype of the state ("float64" for full and Kronecker precisions; diagonal ones keep the
            weights' dtype).
    """

    def __init__(self, dim, dtype):
        self.dim = int(dim)
        self.dtype = dtype

    @staticmethod
    def momentum(state, name, natural_gradient, omega):
        """m <- omega T(m) + (1 - omega) natgrad, before the transport of m (MGVBP's Eq. for the momentum)."""
        return omega * state[name].value + (1.0 - omega) * natural_gradient

    @staticmethod
    def signal_fraction(state, name, average, step, omega, writes):
        """The share of a natural-gradient step that is signal, estimated from its running mean: with
        `average` the momentum m <- omega m + (1 - omega) step and v <- omega v + (1 - omega) |step|^2 (the
        scalar state[name], written through `writes`), rho = |m|^2 / v lies in [0, 1] (Jensen); steps of pure
        noise leave rho at c = (1 - omega) / (1 + omega) on average, consistent steps at 1, so the signal's
        share is (rho - c) / (1 - c), clipped to [0, 1] (1 on the first step, omega = 0). Multiplied into a
        step size it moves fast while the steps agree and averages the noise once they do not, as the
        optimal step of a noisy gradient shrinks with its signal share (Balles, Romero & Hennig 2017,
        "Coupling Adaptive Batch Sizes with Learning Rates", https://arxiv.org/abs/1612.05086)."""
        v = omega * state[name].value + (1.0 - omega) * tf.reduce_sum(tf.square(step))
        writes.assign(state[name], v)
        usable = tf.logical_and(v > 0.0, tf.math.is_finite(v))
        rho = tf.reduce_sum(tf.square(average)) / tf.where(usable, v, tf.ones_like(v))
        noise = (1.0 - omega) / (1.0 + omega)
        share = tf.clip_by_value((rho - noise) / tf.maximum(1.0 - noise, 1e-6), 0.0, 1.0)
        return tf.where(tf.logical_and(usable, omega > 0.0), share, tf.ones_like(v))

    def variables(self, add_variable, prefix):
        raise NotImplementedError

    def initialize(self, state, mean, initial_precision):
        raise NotImplementedError

    def sample(self, state, eps, read=current):
        raise NotImplementedError

    def entropy(self, state):
        raise NotImplementedError

    def distribution(self, state):
        raise NotImplementedError

    def marginal(self, state, offset, size):
        raise NotImplementedError
