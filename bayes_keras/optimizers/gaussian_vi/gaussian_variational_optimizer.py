"""GaussianVariationalOptimizer: base of optimizers whose posterior is an explicit Gaussian q.

Unlike GPF (where the particles ARE the Gaussian), these optimizers keep q's parameters as optimizer
state, and the model's N particle weight sets are N fresh samples from q: every step the model
computes the gradients of the log joint at those samples, the optimizer updates q, and writes N new
samples into the particle variables. The state is saved with the model like any optimizer state.

Blocks: the flattened particle variables are partitioned into blocks (one for all weights, or one per
layer); each block is one posterior family object (bayes_keras.optimizers.gaussian_vi.GaussianFamily:
diagonal, full, Kronecker or softplus-diagonal) that owns the block's variables, sampling, entropy,
distribution and step. A method chooses the blocks and their family and estimates the gradients its
family steps with.
"""

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras.core.bayesian_optimizer import BayesianOptimizer
from bayes_keras.optimizers.gaussian_vi.blockwise_gaussian import BlockwiseGaussian

tfd = tfp.distributions


class GaussianVariationalOptimizer(BayesianOptimizer):
    """Shared machinery; a method implements `_partition(view)` (the blocks), `_family(j, dim)` (block j's
    GaussianFamily) and its estimator: `_update_blocks` (per block, on flattened (N, D_b) tensors) or, with
    `_elementwise = True` (diagonal posteriors), `_update_elementwise` (per particle variable, on slices of
    the one flat block; its family then provides `moments(state, read)`).

    Reports the evidence lower bound per training example as the metric "elbo"
    (mean_n log p(y, w_n) + H(q)) / dataset_size, with w_n the step's samples from q.

    Shared (deterministic) variables, e.g. a learned noise scale, are stepped by an element-wise Adam at
    `shared_learning_rate` (default: 1e-3; MeanFieldVI: its own learning rate).
    """

    reported_metrics = ("elbo",)
    # Diagonal posteriors (MeanFieldVI, MGVBP diagonal) are elementwise: they step each particle variable on
    # its slice of the flat (D,) state (`_update_elementwise`) and sample it from its slice, instead of
    # concatenating the (N, D) particles and gradients and splitting the samples (three full copies of a
    # step's largest tensors); their state keeps the weights' dtype.
    _elementwise = False
    # Mirrored pairs make first-moment estimates (mean gradients) exact in their odd part, but an even
    # function of the draw (a a^T in a Stein or score curvature) sees only S / 2 independent draws.
    _antithetic_by_default = True

    @property
    def posterior_dtype(self):
        """Full and block precisions need float64 (inverses, Cholesky factors, log-determinants);
        diagonal posteriors are elementwise and keep the weights' dtype (float32, or float64 under
        that policy: half the memory traffic of a step, no casts of (N, D) tensors)."""
        return getattr(self, "_weight_dtype", "float32") if self._elementwise else "float64"

    def __init__(self, learning_rate, seed=None, antithetic=None, **kwargs):
        if kwargs.pop("step_rule", None) is not None:
            raise ValueError(
                f"{self.method_name} takes no step_rule: it steps q's parameters by its own rule (MGVBP: "
                "natural gradients with momentum; MeanFieldVI: Adam), and the particles are samples of q."
            )
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.seed = seed
        self.antithetic = None if antithetic is None else bool(antithetic)

    # -- build ---------------------------------------------------------------------------------
    def _partition(self, view):
        """The blocks of q: index lists over the view's particle variables."""
        raise NotImplementedError

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        if not self.view.variables:
            raise ValueError(
                f"{self.method_name} needs particle variables (bayes_keras particle layers)."
            )
        self._weight_dtype = self.view.variables[0].dtype
        self._blocks = self._partition(self.view)
        self._block_dims = [sum(self.view.sizes[i] for i in b) for b in self._blocks]
        if self._elementwise and self._blocks != [list(range(len(self.view)))]:
            raise ValueError(
                f"{self.method_name}: an elementwise posterior needs one block over all particle "
                f"variables in order; got blocks {self._blocks}."
            )
        self.lower_bound = self.add_variable((), name="lower_bound")
        self._sample_counter = self.add_variable((), dtype="int64", name="sample_counter")
        self._families, self._state = [], []
        for j, dim in enumerate(self._block_dims):
            family = self._family(j, dim)
            self._families.append(family)
            self._state.append(family.variables(self._add, f"block{j}"))
        with tf.init_scope():  # Keras may build inside the traced train step: initialise eagerly
            n = self.view.num_particles
            initial = [np.reshape(v.numpy(), (n, -1)) for v in self.view.variables]
            for j, block in enumerate(self._blocks):
                mean = np.concatenate([initial[i][0] for i in block])  # one member's initialisation
                self._families[j].initialize(self._state[j], mean)
            self.resample()

    def _family(self, index, dim):
        """Block `index`'s GaussianFamily over `dim` weights."""
        raise NotImplementedError

    def _add(self, shape, name, dtype):
        """A family's state variable (an optimizer variable: saved with the model)."""
        return self.add_variable(tuple(shape), dtype=dtype, name=name)

    # -- sampling ------------------------------------------------------------------------------
    def _normal(self, rows, widths):
        """Standard normals (float32), a list of (rows, w) tensors for `widths`, from a stateless
        generator keyed by (seed, draw counter): a resumed run draws exactly what an uninterrupted one
        would. Box-Muller on stateless uniforms, written out: cheaper than tf.random.stateless_normal
        on CPU, where drawing the normals was the largest single cost of a Gaussian-VI step
        (docs/architecture.md). The sum(widths) columns are the cosines, then the sines, split into
        the pieces. 1 - u1 is at least 2^-24, so |z| <= 5.8 (a tail of 8e-9 is cut)."""
        seed = 0 if self.seed is None else int(self.seed)
        key = tf.stack([tf.constant(seed, tf.int64), self._sample_counter.value])
        d = sum(widths)
        half = (d + 1) // 2
        # Philox named explicitly: the default "auto_select" is Philox on CPU and GPU kernels but
        # ThreeFry under XLA, whose CPU version is 12x slower (and a different stream).
        u1, u2 = tf.unstack(
            tf.random.stateless_uniform((2, rows, half), seed=key, dtype=tf.float32, alg="philox")
        )
        radius = tf.sqrt(-2.0 * tf.math.log(1.0 - u1))  # 1 - u in (0, 1]
        angle = (2.0 * np.pi) * u2
        z = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=1)
        cut = [2 * half - d] if 2 * half > d else []  # odd d: the last sine is not used
        pieces = tf.split(z, list(widths) + cut, axis=1) if len(widths) > 1 or cut else [z]
        return pieces[: len(widths)]

    def _antithetic_for(self, num_samples):
        antithetic = self._antithetic_by_default if self.antithetic is None else self.antithetic
        return antithetic and num_samples % 2 == 0

    def _draw(self, num_samples):
        """The standard normals of the next sample of q, keyed by the current draw counter: one
        (num_samples, D_b) tensor per block; with `antithetic` (and an even count) the second half
        mirrors the first."""
        widths = self._block_dims
        if self._antithetic_for(num_samples):
            return [tf.concat([e, -e], axis=0) for e in self._normal(num_samples // 2, widths)]
        return self._normal(num_samples, widths)

    def prepare_step(self):
        """The normals of this step's resample, drawn before the forward pass (BayesianModel hands them
        back as `step.prepared`). They depend only on the draw counter, not on the step's gradients, so the
        executor can generate them on an idle core while the forward and backward passes run; drawn
        inside the update they sat on the critical path after the finiteness check (docs/architecture.md).
        Same key, same numbers: the stream is unchanged."""
        return self._draw(self.view.num_particles) if self.built else None

    def sample(self, num_samples, eps=None):
        """`num_samples` weight sets from q: a list of (num_samples, *shape) tensors, one per particle
        variable (in the model's particle-variable order). With `antithetic` (and an even count) the
        second half mirrors the first through the mean, theta_{s + S/2} - mu = -(theta_s - mu): half the
        random numbers, and the sample mean of theta - mu is exactly zero. Advances the draw counter."""
        out = self._sample(num_samples, eps, lambda v: v.value)
        self._sample_counter.assign_add(1)
        return out

    def _sample(self, num_samples, eps, read):
        """Samples of q whose state variables are read through `read` (the current values, or a step's
        new ones), from the normals `eps` (drawn with the current counter if None)."""
        if eps is None:
            eps = self._draw(num_samples)
        view = self.view
        if self._elementwise:  # (D,) moments and normals split into per-variable pieces
            if len(view) > 1:
                eps = tf.split(eps[0], view.sizes, axis=1)
            mean, std = (
                tf.split(t, view.sizes) for t in self._families[0].moments(self._state[0], read)
            )
            return [
                tf.reshape(m + tf.cast(e, m.dtype) * sd, (num_samples,) + view.shapes[i])
                for i, (m, sd, e) in enumerate(zip(mean, std, eps))
            ]
        out = [None] * len(view)
        for j, (block, e) in enumerate(zip(self._blocks, eps)):
            sample = self._families[j].sample(
                self._state[j], tf.cast(e, self.posterior_dtype), read
            )
            for i, piece in view.split(sample, block).items():
                out[i] = piece
        return out

    def resample(self, eps=None):
        """Write N fresh samples from q into the particle variables."""
        for v, value in zip(self.view.variables, self.sample(self.view.num_particles, eps)):
            v.assign(tf.cast(value, v.dtype))

    def _flatten(self, tensors):
        """Per-variable (N, ...) tensors -> per-block (N, D_b) tensors in the posterior dtype."""
        flat = self.view.flatten(tensors, self.posterior_dtype)
        return [self.view.concat(flat, b) for b in self._blocks]

    # -- the update ----------------------------------------------------------------------------
    def report(self, step):
        """The evidence lower bound per training example, mean_n log p(y, w_n) + H(q), before the update
        (the particles are samples of the q whose entropy this is)."""
        log_joint = step.log_joint
        return {
            "elbo": (tf.reduce_mean(log_joint) + tf.cast(self.entropy(), log_joint.dtype))
            / step.dataset_size
        }

    def update_particles(self, grads, learning_rate, iteration, step, writes):
        if step is not None:  # this step's bound, for LowerBoundStopping
            writes.assign(self.lower_bound, self.report(step)["elbo"])
        learning_rate = tf.cast(learning_rate, self.posterior_dtype)
        pvars = self.view.variables
        if self._elementwise:  # the posterior dtype is the weights'
            thetas = self.view.flat_particles()
            loss_grads = self.view.flat_gradients(grads)
            self._update_elementwise(thetas, loss_grads, learning_rate, iteration, step, writes)
        else:
            thetas = self._flatten([v.value for v in pvars])
            # The model hands over gradients of the NEGATIVE log joint; the methods ascend the log joint.
            log_joint_grads = [-g for g in self._flatten(grads)]
            self._update_blocks(thetas, log_joint_grads, learning_rate, iteration, step, writes)
        eps = None if step is None else step.prepared
        for v, value in zip(pvars, self._sample(self.view.num_particles, eps, writes.read)):
            writes.assign(v, value)
        writes.assign(self._sample_counter, self._sample_counter.value + 1)

    def _update_blocks(self, thetas, grads, learning_rate, iteration, step, writes):
        """Per block: (N, D_b) samples and gradients of the log joint (ascent); new state into `writes`."""
        raise NotImplementedError

    def _update_elementwise(self, thetas, loss_grads, learning_rate, iteration, step, writes):
        """Elementwise optimizers: per particle variable, its (N, d_v) samples and the gradients of
        the NEGATIVE log joint as the model gives them (negated on (d_v,) results, not on (N, d_v));
        the variables' slices of the flat state are tf.split(state, self.view.sizes)."""
        raise NotImplementedError

    # -- the Gaussian --------------------------------------------------------------------------
    def entropy(self):
        """Entropy of q (the optimizer's state)."""
        self._check_built()
        return tf.cast(
            tf.add_n([f.entropy(s) for f, s in zip(self._families, self._state)]), tf.float32
        )

    def posterior(self, flatten=True):
        """q as TFP distributions. flatten=True: one distribution over all particle weights,
        flattened and concatenated in particle-variable order (event shape (D,)). flatten=False: a
        dict {variable path: distribution over that variable's flattened weights} (marginals of q)."""
        self._check_built()
        blocks = [f.distribution(s) for f, s in zip(self._families, self._state)]
        if flatten:
            if len(blocks) == 1:
                return blocks[0]
            order = [i for b in self._blocks for i in b]
            if order != sorted(order):
                raise NotImplementedError("flatten=True needs blocks in variable order.")
            return BlockwiseGaussian(blocks)
        out = {}
        for j, block in enumerate(self._blocks):
            offset = 0
            for i in block:
                out[self.view.variables[i].path] = self._families[j].marginal(
                    self._state[j], offset, self.view.sizes[i]
                )
                offset += self.view.sizes[i]
        return out

    def _check_built(self):
        if not self.built:
            raise ValueError(
                f"{self.name} holds no posterior yet: q is built by the first training step (or by "
                "optimizer.build(model.trainable_variables))."
            )

    @property
    def posterior_variables(self):
        """The optimizer variables that define q (to snapshot / restore, e.g. by LowerBoundStopping)."""
        return [v for block in self._state for v in block.values()]

    @property
    def posterior_blocks(self):
        """q's state per block, [{name: variable}], in block order: the family's variables ("mean",
        "precision" or "rho", Kronecker factors, ...) and the method's own (momentum, control
        variates, Adam's moments); see the block's family (`DiagonalGaussian`, `FullGaussian`,
        `KroneckerGaussian`, `SoftplusGaussian` in this package) for their meaning."""
        return [dict(block) for block in self._state]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "seed": self.seed,
                "antithetic": self.antithetic,
            }
        )
        return config
