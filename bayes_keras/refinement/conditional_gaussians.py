"""M diagonal Gaussians, each fitted to its own conditional lower bound: the inner loop of local refinement."""

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp


class ConditionalGaussians:
    """q_m(w) = N(nu_m, softplus(r_m)^2) over D coordinates for m = 1..M, fitted together by Adam.

    Each q_m maximises its own conditional lower bound (Havasi et al. 2021, the stage objective after Eq. 4)

        L_m = E_{q_m}[ell_m(w)] - KL(q_m || N(b_m, s^2)),

    where ell_m is the log likelihood (whatever of the log joint is not the Gaussian prior) and
    N(b_m, s^2) the conditional prior given the auxiliary variables drawn so far. The expectation takes
    one reparameterised sample per q_m and step, w = nu + sigma eps; the KL is exact:

        d(-L)/d nu    = -grad ell(w) + (nu - b) / s^2
        d(-L)/d sigma = -grad ell(w) eps - 1 / sigma + sigma / s^2,   sigma = softplus(r).

    A stage starts from given moments with fresh Adam state (`start`), as the paper prescribes.

    Args:
        num_samples: M.
        dim: D.
        dtype: of the state and the samples.
        seed: integer seed of the stateless draws (keyed by (seed, draw counter)).
    """

    def __init__(self, num_samples, dim, dtype="float32", seed=0):
        shape = (int(num_samples), int(dim))
        zeros = np.zeros(shape)
        self.dtype = tf.as_dtype(dtype)
        self.num_samples, self.dim = shape

        def variable(value, name, dtype=self.dtype):
            return tf.Variable(tf.constant(value, dtype), trainable=False, name=name)

        self.nu, self.r = variable(zeros, "mean"), variable(zeros, "std_parameter")
        self.slots = [variable(zeros, name) for name in ("m_mean", "v_mean", "m_std", "v_std")]
        self.b = variable(zeros, "prior_mean")
        self.s2 = variable(np.ones(shape), "prior_variance")
        # per sample and coordinate
        self.learning_rate = variable(np.full(shape, 1e-3), "learning_rate")
        self.t = variable(0, "adam_step", tf.int64)
        self.draws = variable(0, "draw_counter", tf.int64)
        self.seed = int(seed)

    def start(self, mean, variance, prior_mean, prior_variance, learning_rate):
        """A new stage: q_m = N(mean_m, variance_m), conditional prior N(prior_mean_m, prior_variance), fresh Adam
        with `learning_rate` (a scalar, or per sample and coordinate (M, D))."""
        std = np.sqrt(np.asarray(variance, np.float64))
        self.nu.assign(tf.cast(np.broadcast_to(mean, self.nu.shape), self.dtype))
        self.r.assign(
            tf.cast(tfp.math.softplus_inverse(np.broadcast_to(std, self.r.shape)), self.dtype)
        )
        self.b.assign(tf.cast(np.broadcast_to(prior_mean, self.b.shape), self.dtype))
        self.s2.assign(tf.cast(np.broadcast_to(prior_variance, self.s2.shape), self.dtype))
        self.learning_rate.assign(
            tf.cast(np.broadcast_to(learning_rate, self.learning_rate.shape), self.dtype)
        )
        for slot in self.slots:
            slot.assign(tf.zeros_like(slot))
        self.t.assign(0)

    def moments(self):
        """(mean, variance) of every q_m as float64 numpy arrays (M, D)."""
        sigma = tf.math.softplus(tf.cast(self.r, tf.float64))
        return tf.cast(self.nu, tf.float64).numpy(), tf.square(sigma).numpy()

    def normals(self, leading=()):
        """leading + (M, D) standard normals from the next key of the stream."""
        key = tf.stack([tf.constant(self.seed, tf.int64), self.draws.read_value()])
        self.draws.assign_add(1)
        return tf.random.stateless_normal(
            tuple(leading) + (self.num_samples, self.dim), key, dtype=self.dtype, alg="philox"
        )

    def sample(self, leading=()):
        """Draws w_m ~ q_m for every m: leading + (M, D)."""
        return self.nu + tf.math.softplus(self.r) * self.normals(leading)

    def kl(self):
        """KL(q_m || N(b_m, s^2)) for every m: (M,)."""
        var = tf.square(tf.math.softplus(self.r))
        return 0.5 * tf.reduce_sum(
            var / self.s2
            + tf.square(self.nu - self.b) / self.s2
            - 1.0
            - tf.math.log(var / self.s2),
            axis=1,
        )

    def step(self, value_and_gradient):
        """One Adam step on every q_m. `value_and_gradient(w)` -> (ell (M,), grad ell (M, D)) at w (M, D).
        Returns the step's ell (M,) (at the draws from q before the step)."""
        eps = self.normals()
        sigma = tf.math.softplus(self.r)
        w = self.nu + sigma * eps
        ell, grad = value_and_gradient(w)
        grad = tf.cast(grad, self.dtype)
        grad_nu = -grad + (self.nu - self.b) / self.s2
        grad_sigma = -grad * eps - 1.0 / sigma + sigma / self.s2
        grad_r = grad_sigma * tf.math.sigmoid(self.r)
        self.t.assign_add(1)
        t = tf.cast(self.t, self.dtype)
        beta_1, beta_2, epsilon = 0.9, 0.999, 1e-8
        lr = self.learning_rate * tf.sqrt(1.0 - beta_2**t) / (1.0 - beta_1**t)
        for variable, g, (m, v) in (
            (self.nu, grad_nu, self.slots[:2]),
            (self.r, grad_r, self.slots[2:]),
        ):
            m.assign(beta_1 * m + (1.0 - beta_1) * g)
            v.assign(beta_2 * v + (1.0 - beta_2) * tf.square(g))
            variable.assign_sub(lr * m / (tf.sqrt(v) + epsilon))
        return ell
