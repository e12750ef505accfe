"""ParticleFlowBayesRule: a meta-learned ODE operator that moves a particle posterior to the next one."""

import numpy as np
import keras
import tensorflow as tf

from bayes_keras.pfbr.concat_squash_dense import ConcatSquashDense
from bayes_keras.pfbr.integrator import hutchinson_divergence, integrate_flow
from bayes_keras.pfbr.problem import SequentialProblem, autodiff_hessian

DIVERGENCES = ("exact", "hutchinson")
STANDARDIZATIONS = (True, False, "full")


@keras.saving.register_keras_serializable(package="bayes_keras")
class ParticleFlowBayesRule(keras.Model):
    """Particle Flow Bayes' Rule (Chen, Dai & Song, ICML 2019, https://arxiv.org/abs/1902.00640).

    One learned operator X_{n+1} = F(X_n, o_{n+1}) turns N equally weighted particles of the posterior
    p(x | o_1..o_n) into particles of p(x | o_1..o_{n+1}), with no re-optimisation and no stored past
    observations. Each particle follows the ODE (Eq. 5)

        dx/dt = f(E[phi(X_n, g(X_n))], g(x(t)), x(t), t),   t in [0, time_length],

    where g(x) = grad_x log p(o_{n+1} | x) carries the observation (the paper's option that generalises
    across likelihoods: the velocity does not need to know the likelihood's form) and the particle mean
    of phi is a DeepSet embedding of the current posterior and of the likelihood's gradient field at
    its particles. The log density is carried by the divergence (Theorem 2.1, see `integrator.py`).

    With `standardize=True` (default) the flow runs in the coordinates z = (x - m) / s of the current
    particles' mean m and per-coordinate standard deviation s (the gradient enters as s * g): Bayes' rule
    commutes with such affine maps, so one operator serves posteriors of every width a long sequence
    reaches (the divergence, and hence log q, is the same in both coordinates up to the constant
    sum(log s), which cancels within a stage). `standardize="full"` whitens instead: z = L^-1 (x - m) with
    L the Cholesky factor of the particles' covariance (the gradient enters as L^T g). Per-coordinate
    scaling leaves correlations: a posterior stretched along a diagonal (the bimodal mixture's ridge)
    keeps its narrow direction a few hundredths of a unit wide in z, below what the tanh layers resolve;
    whitened, every direction has unit spread.

    With `likelihood_value=True` the velocity and the embedding also see each particle's log-likelihood
    value, centred by its mean over the stage's starting particles: l(x(t)) - mean_j l(x_j). Bayes' rule
    reweights separated modes by their likelihood values, which the gradient does not show (it is about
    zero at every mode), so an operator that only sees gradients cannot tell which of two modes a new
    observation favours; with the values it can move the right share of particles between them.

    Architecture (Section 3.2 and the authors' released code): phi = Dense(embedding_units, tanh) on
    (z_j, s g_j) averaged over particles (its inputs detached, as in the released code); z, s g and the
    embedding each mapped to `hidden_units` with tanh, concatenated, Dense(hidden_units, tanh); then
    `body_layers` ConcatSquashDense(hidden_units) + tanh layers and a ConcatSquashDense(latent_dim)
    output (zero-initialised: the untrained flow is the identity). Integration: RK4 with `steps` fixed
    steps over [0, time_length].

    Meta-training (`meta_fit`, Section 3.3, Eq. 17): the loss of a task is the sum over stages of
    KL(q_n || p(x | o_1..o_n)) up to constants, E_{q_n}[log q_n(x) - log pi(x) - sum_{j<=n} log p(o_j|x)],
    estimated with the particles and their carried log densities; sequence segmentation detaches the
    particles every `segment_length` stages (truncated backpropagation).

    Example:

        problem = bk.pfbr.GaussianMeanProblem(dim=2)
        pfbr = bk.pfbr.ParticleFlowBayesRule(latent_dim=2)
        pfbr.meta_fit(problem, iterations=200)
        task, observations = problem.sample_tasks(1, length=100, rng=np.random.default_rng(1), prefix=0)
        posteriors = pfbr.filter(problem, task, observations, num_particles=256)   # (100, 1, 256, 2)
    """

    def __init__(
        self,
        latent_dim,
        hidden_units=64,
        embedding_units=64,
        body_layers=3,
        time_length=1.0,
        steps=5,
        divergence="exact",
        standardize=True,
        likelihood_value=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (
            ("latent_dim", latent_dim),
            ("hidden_units", hidden_units),
            ("embedding_units", embedding_units),
            ("steps", steps),
        ):
            if not _integer_at_least(value, 1):
                raise ValueError(
                    f"ParticleFlowBayesRule: {name} must be a positive integer; got {value!r}."
                )
        if not _integer_at_least(body_layers, 0):
            raise ValueError(
                f"ParticleFlowBayesRule: body_layers must be a non-negative integer; got {body_layers!r}."
            )
        if not _positive_number(time_length):
            raise ValueError(
                f"ParticleFlowBayesRule: time_length must be a positive number; got {time_length!r}."
            )
        if not isinstance(likelihood_value, (bool, np.bool_)):
            raise ValueError(
                f"ParticleFlowBayesRule: likelihood_value must be True or False; got {likelihood_value!r}."
            )
        if standardize not in STANDARDIZATIONS:
            raise ValueError(
                f"ParticleFlowBayesRule: standardize must be one of {STANDARDIZATIONS}; got {standardize!r}."
            )
        if divergence not in DIVERGENCES:
            raise ValueError(
                f"ParticleFlowBayesRule: divergence must be one of {DIVERGENCES}; got {divergence!r}."
            )
        self.latent_dim = int(latent_dim)
        self.hidden_units = int(hidden_units)
        self.embedding_units = int(embedding_units)
        self.body_layers = int(body_layers)
        self.time_length = float(time_length)
        self.steps = int(steps)
        self.divergence = divergence
        self.standardize = standardize if isinstance(standardize, str) else bool(standardize)
        self.likelihood_value = bool(likelihood_value)
        self.embedding_layer = keras.layers.Dense(
            self.embedding_units, activation="tanh", name="embedding"
        )
        self.position_layer = keras.layers.Dense(
            self.hidden_units, activation="tanh", name="position"
        )
        self.gradient_layer = keras.layers.Dense(
            self.hidden_units, activation="tanh", name="gradient"
        )
        self.value_layer = (
            keras.layers.Dense(self.hidden_units, activation="tanh", name="value")
            if self.likelihood_value
            else None
        )
        self.context_layer = keras.layers.Dense(
            self.hidden_units, activation="tanh", name="context"
        )
        self.body = [
            ConcatSquashDense(self.hidden_units, name=f"body_{i}") for i in range(self.body_layers)
        ]
        self.output_layer = ConcatSquashDense(
            self.latent_dim, kernel_initializer="zeros", name="velocity"
        )
        self.linear_position = keras.layers.Dense(
            self.latent_dim, use_bias=False, kernel_initializer="zeros", name="linear_position"
        )
        self.linear_gradient = keras.layers.Dense(
            self.latent_dim, use_bias=False, kernel_initializer="zeros", name="linear_gradient"
        )
        self._compiled_stage = {}
        self._compiled_train = {}
        self.build()

    def build(self, input_shape=None):
        d, h = self.latent_dim, self.hidden_units
        values = int(self.likelihood_value)
        self.embedding_layer.build((None, 2 * d + values))
        self.position_layer.build((None, d))
        self.gradient_layer.build((None, d))
        if self.likelihood_value:
            self.value_layer.build((None, 1))
        self.context_layer.build((None, (2 + values) * h + self.embedding_units))
        for layer in self.body:
            layer.build(((None, h), ()))
        self.output_layer.build(((None, h), ()))
        self.linear_position.build((None, d))
        self.linear_gradient.build((None, d))
        self.built = True

    # ---- the velocity field ------------------------------------------------------------------------
    def _check_value(self, value):
        if self.likelihood_value and value is None:
            raise ValueError(
                "ParticleFlowBayesRule(likelihood_value=True) needs the centred log-likelihood values "
                "(value=...); got None."
            )

    def _features(self, z, g, value):
        features = [self.position_layer(z), self.gradient_layer(g)]
        if self.likelihood_value:
            features.append(self.value_layer(value))
        return features

    def embed(self, z, g, value=None):
        """DeepSet embedding of a particle set and the likelihood gradient at its particles: (B, N, d) x 2
        (and, with likelihood_value, the centred log-likelihood values (B, N, 1)) -> (B, E)."""
        self._check_value(value)
        inputs = [z, g] + ([value] if self.likelihood_value else [])
        return tf.reduce_mean(self.embedding_layer(tf.concat(inputs, axis=-1)), axis=-2)

    def velocity(self, z, g, embedding, t, value=None):
        """dz/dt for rows z, g (M, d) (and centred log-likelihood values (M, 1) with likelihood_value)
        with their task's embedding (M, E) at time t (scalar)."""
        self._check_value(value)
        h = self.context_layer(tf.concat(self._features(z, g, value) + [embedding], axis=-1))
        for layer in self.body:
            h = tf.tanh(layer([h, t]))
        return self.output_layer([h, t]) + self.linear_position(z) + self.linear_gradient(g)

    def velocity_and_divergence(self, z, g, g_jacobian, embedding, t, value=None):
        """dz/dt and its exact divergence trace(d velocity / dz) per row, by carrying the d tangents
        d/dz_i through the layers (forward mode, one pass): `g_jacobian` (M, d, d) holds dg_j / dz_i,
        the likelihood term's own dependence on the particle's position; the value's tangent is g
        itself (g is the gradient of the value in z)."""

        def rows(tangent, kernel):
            return tf.einsum("mih,hk->mik", tangent, kernel)

        self._check_value(value)
        hidden = self.hidden_units
        features = self._features(z, g, value)
        position, gradient = features[:2]
        d_features = [
            (1.0 - tf.square(position))[:, None, :] * self.position_layer.kernel[None],
            (1.0 - tf.square(gradient))[:, None, :] * rows(g_jacobian, self.gradient_layer.kernel),
        ]
        if self.likelihood_value:
            d_features.append(
                (1.0 - tf.square(features[2]))[:, None, :]
                * g[:, :, None]
                * self.value_layer.kernel[None]
            )
        h = self.context_layer(tf.concat(features + [embedding], axis=-1))
        context_kernel = self.context_layer.kernel
        d_h = (1.0 - tf.square(h))[:, None, :] * tf.add_n(
            [
                rows(d, context_kernel[i * hidden : (i + 1) * hidden])
                for i, d in enumerate(d_features)
            ]
        )
        for layer in self.body:
            gate = tf.sigmoid(layer.gate_kernel * t + layer.gate_bias)
            h = tf.tanh(layer([h, t]))
            d_h = (1.0 - tf.square(h))[:, None, :] * rows(d_h, layer.kernel) * gate
        gate = tf.sigmoid(self.output_layer.gate_kernel * t + self.output_layer.gate_bias)
        f = self.output_layer([h, t]) + self.linear_position(z) + self.linear_gradient(g)
        jacobian = (
            rows(d_h, self.output_layer.kernel) * gate
            + self.linear_position.kernel[None]
            + rows(g_jacobian, self.linear_gradient.kernel)
        )
        return f, tf.linalg.trace(jacobian)

    def call(self, inputs):
        return self.velocity(*inputs)

    # ---- one Bayes update ----------------------------------------------------------------------------
    def update(
        self, particles, log_likelihood, log_density=None, seed=None, log_likelihood_hessian=None
    ):
        """Moves `particles` ((B, N, d) or (N, d)) of the current posterior to the posterior that also
        conditions on one new observation (or mini-batch) whose log likelihood `log_likelihood(x)` maps
        (B, N, d) particles to (B, N). With `log_density` ((B, N) or (N,)) the particles' log densities
        are carried along (Theorem 2.1); the exact divergence needs the Hessian of the log likelihood
        in x, `log_likelihood_hessian(x)` -> (B, N, d, d), by automatic differentiation when not given.
        With (N, d) particles the callables see (N, d) and return (N,) (and (N, d, d)). `seed`: the
        Hutchinson probes' stateless seed, an int or a shape-[2] int tensor (random when None).
        Returns tensors (particles, log_density or None), shaped as given.

        Called eagerly with log densities, the automatic-differentiation Hessian is traced anew at each
        of the 4 x steps field evaluations (seconds per update): for a loop of updates, wrap the loop
        body in one `tf.function` of your own (far faster), or give `log_likelihood_hessian`;
        `filter` compiles a problem's stages itself.

        Example:

            x = np.random.default_rng(0).normal(size=(256, 2))      # draws of the prior N(0, I)
            log_q = -0.5 * np.sum(x**2, -1) - np.log(2 * np.pi)     # their log density
            observation = tf.constant([0.5, -1.0])
            log_likelihood = lambda x: -0.5 * tf.reduce_sum((x - observation) ** 2, -1)   # (N, 2) -> (N,)
            x, log_q = operator.update(x, log_likelihood, log_density=log_q)
        """
        particles = tf.convert_to_tensor(particles, self.compute_dtype)
        single = particles.shape.rank == 2
        if particles.shape.rank not in (2, 3) or particles.shape[-1] != self.latent_dim:
            raise ValueError(
                f"ParticleFlowBayesRule: particles must have shape (num_particles, {self.latent_dim}) or "
                f"(tasks, num_particles, {self.latent_dim}); got {tuple(particles.shape)}."
            )
        if particles.shape[-2] is not None and particles.shape[-2] < 2:
            raise ValueError(
                f"ParticleFlowBayesRule: update needs at least 2 particles per task; got {particles.shape[-2]}."
            )
        _check_finite("particles", particles)
        if log_density is not None:
            log_density = tf.convert_to_tensor(log_density, self.compute_dtype)
            if (
                log_density.shape.is_fully_defined()
                and particles.shape[:-1].is_fully_defined()
                and log_density.shape != particles.shape[:-1]
            ):
                raise ValueError(
                    f"ParticleFlowBayesRule: log_density must have shape {tuple(particles.shape[:-1])}, one "
                    f"value per particle; got {tuple(log_density.shape)}."
                )
            _check_finite("log_density", log_density)
        _check_log_likelihood(log_likelihood, particles)
        if single:
            particles = particles[None]
            inner = log_likelihood
            log_likelihood = lambda x: tf.reshape(inner(x[0]), [1, -1])  # noqa: E731
            if log_likelihood_hessian is not None:
                inner_hessian = log_likelihood_hessian
                log_likelihood_hessian = lambda x: inner_hessian(x[0])[None]  # noqa: E731
        if log_density is not None:
            log_density = tf.reshape(log_density, tf.shape(particles)[:2])
        if seed is not None:
            seed = tf.convert_to_tensor(seed)
            if seed.shape.rank == 0:
                seed = tf.stack([seed, tf.zeros_like(seed)])
            if seed.shape != (2,) or not seed.dtype.is_integer:
                raise ValueError(
                    f"ParticleFlowBayesRule: seed must be an int or a shape-[2] int tensor; got {seed!r}."
                )
        new, new_log_density = self._flow(
            particles, log_likelihood, log_density, seed, log_likelihood_hessian
        )
        if single:
            new = new[0]
            new_log_density = None if new_log_density is None else new_log_density[0]
        _check_finite(
            "the updated particles",
            new,
            cause=" from finite inputs: check the log likelihood's "
            "values at the particles (an extreme or non-finite observation?)",
        )
        return new, new_log_density

    def _flow(self, particles, log_likelihood, log_density, seed, log_likelihood_hessian=None):
        shape = tf.shape(particles)
        num_tasks, num_particles, d = shape[0], shape[1], self.latent_dim
        if log_likelihood_hessian is None:
            log_likelihood_hessian = lambda x: autodiff_hessian(log_likelihood, x)  # noqa: E731

        def likelihood_value_and_gradient(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                value = log_likelihood(x)
            return value, tape.gradient(value, x)

        start = tf.stop_gradient(particles)
        coordinates = _StandardCoordinates(start, self.standardize)
        start_value, start_gradient = likelihood_value_and_gradient(start)
        start_value = tf.stop_gradient(start_value)
        start_gradient = coordinates.gradient(tf.stop_gradient(start_gradient))
        # The values enter centred by the starting particles' mean (fixed during the flow, as the embedding).
        value_center = tf.reduce_mean(start_value, axis=1, keepdims=True)
        start_value = (start_value - value_center)[..., None] if self.likelihood_value else None
        embedding = self.embed(coordinates.to_z(start), start_gradient, start_value)
        embedding = tf.reshape(
            tf.repeat(embedding[:, None, :], num_particles, axis=1), [-1, self.embedding_units]
        )

        def scaled_gradient(z_rows):
            """x, the gradient in z (L^T grad log p(o | x)) (M, d) and the centred value (M, 1) or None."""
            x = coordinates.to_x(tf.reshape(z_rows, shape))
            value, gradient = likelihood_value_and_gradient(x)
            value = tf.reshape(value - value_center, [-1, 1]) if self.likelihood_value else None
            return x, tf.reshape(coordinates.gradient(gradient), [-1, d]), value

        probe = None
        if log_density is not None and self.divergence == "hutchinson":
            seed = (
                tf.random.uniform([2], maxval=2**31 - 1, dtype=tf.int32) if seed is None else seed
            )
            probe = tf.cast(
                2
                * tf.random.stateless_uniform(
                    [num_tasks * num_particles, d], seed, maxval=2, dtype=tf.int32
                )
                - 1,
                particles.dtype,
            )

        def field(z_rows, t, with_divergence):
            if with_divergence and self.divergence == "hutchinson":

                def velocity(z, t):
                    _, g, value = scaled_gradient(z)
                    return self.velocity(z, g, embedding, t, value)

                return hutchinson_divergence(velocity, z_rows, t, probe)
            x, g, value = scaled_gradient(z_rows)
            if not with_divergence:
                return self.velocity(z_rows, g, embedding, t, value), None
            hessian = coordinates.hessian(log_likelihood_hessian(x))
            return self.velocity_and_divergence(
                z_rows, g, tf.reshape(hessian, [-1, d, d]), embedding, t, value
            )

        z = tf.reshape(coordinates.to_z(particles), [-1, d])
        flat_log_density = None if log_density is None else tf.reshape(log_density, [-1])
        z, flat_log_density = integrate_flow(
            field, z, flat_log_density, time_length=self.time_length, steps=self.steps
        )
        new = coordinates.to_x(tf.reshape(z, shape))
        new_log_density = (
            None
            if flat_log_density is None
            else tf.reshape(flat_log_density, [num_tasks, num_particles])
        )
        return new, new_log_density

    # ---- stages of a problem -------------------------------------------------------------------------
    def _stage(self, problem, particles, log_density, observation, task, seed):
        """One stage: (state-space problems) propagate the particles through the transition, then the
        Bayes update by the flow. Returns (particles, log_density, predictive_particles or None)."""
        previous = None
        if problem.state_space:
            previous = particles
            particles = problem.transition(previous, task, seed)
            if log_density is not None:
                log_density = problem.log_transition_mixture(particles, previous, task)
        new, new_log_density = self._flow(
            particles,
            lambda x: problem.log_likelihood(x, observation, task),
            log_density,
            seed,
            lambda x: problem.log_likelihood_hessian(x, observation, task),
        )
        return new, new_log_density, previous

    def _stage_function(self, problem, track):
        key = (id(problem), track)
        if key not in self._compiled_stage:
            # XLA halves a stage's time on CPU; the training step stays a plain graph (its gradient
            # through the while loops is slower under XLA).
            @tf.function(reduce_retracing=True, jit_compile=True)
            def stage(particles, log_density, observation, task, seed):
                new, new_log_density, _ = self._stage(
                    problem, particles, log_density if track else None, observation, task, seed
                )
                return new, (new_log_density if track else log_density)

            self._compiled_stage[key] = stage
        return self._compiled_stage[key]

    def filter(
        self,
        problem,
        task,
        observations,
        particles=None,
        num_particles=256,
        seed=0,
        log_density=False,
    ):
        """Applies the operator recursively along `observations` (B, L, m, k) of the tasks `task`, from
        `particles` (B, N, d) or N fresh draws of the tasks' prior. Returns the particles after every
        stage, a numpy array (L, B, N, d); with `log_density=True` also their log densities (L, B, N)."""
        if not isinstance(problem, SequentialProblem):
            raise TypeError(
                f"ParticleFlowBayesRule.filter: problem must be a bayes_keras.pfbr.SequentialProblem; "
                f"got {type(problem).__name__}."
            )
        task = problem.as_task_tensors(task)
        observations = tf.convert_to_tensor(observations, tf.float32)
        if observations.shape.rank != 4:
            raise ValueError(
                f"ParticleFlowBayesRule.filter: observations must have shape (tasks, length, "
                f"observations_per_update, observation_dim); got {tuple(observations.shape)}."
            )
        if problem.latent_dim != self.latent_dim:
            raise ValueError(
                f"ParticleFlowBayesRule.filter: the problem's latent dimension is {problem.latent_dim}, "
                f"the operator's is {self.latent_dim}."
            )
        if observations.shape[1] == 0:
            raise ValueError(
                "ParticleFlowBayesRule.filter: observations hold no stage (length 0); got shape "
                f"{tuple(observations.shape)}."
            )
        problem.check_observations(observations[:, 0])
        _check_finite("observations", observations)
        tasks = {name: value.shape[0] for name, value in task.items() if value.shape.rank}
        for name, count in tasks.items():
            if count != observations.shape[0]:
                raise ValueError(
                    f"ParticleFlowBayesRule.filter: observations hold {observations.shape[0]} tasks, "
                    f"the task's '{name}' {count}."
                )
        seeds = tf.random.split(tf.constant([int(seed), 0], tf.int64), observations.shape[1] + 1)
        if particles is None:
            if not _integer_at_least(num_particles, 2):
                raise ValueError(
                    f"ParticleFlowBayesRule.filter: num_particles must be an integer >= 2; got {num_particles!r}."
                )
            particles, density = problem.sample_prior(task, int(num_particles), seeds[-1])
        else:
            particles = tf.convert_to_tensor(particles, tf.float32)
            if (
                particles.shape.rank != 3
                or particles.shape[-1] != self.latent_dim
                or particles.shape[1] < 2
                or particles.shape[0] != observations.shape[0]
            ):
                raise ValueError(
                    f"ParticleFlowBayesRule.filter: particles must have shape ({observations.shape[0]}, "
                    f"num_particles >= 2, {self.latent_dim}), one set per task; got {tuple(particles.shape)}."
                )
            _check_finite("particles", particles)
            density = (
                problem.log_prior(particles, task)
                if log_density
                else tf.zeros(tf.shape(particles)[:2])
            )
        stage = self._stage_function(problem, bool(log_density))
        out, densities = [], []
        for n in range(observations.shape[1]):
            particles, density = stage(particles, density, observations[:, n], task, seeds[n])
            out.append(particles.numpy())
            densities.append(density.numpy())
            if not np.all(np.isfinite(out[-1])):
                raise FloatingPointError(
                    f"ParticleFlowBayesRule.filter: the particles became non-finite at stage {n} "
                    "from finite inputs; the operator may not fit this problem's observations."
                )
        out = np.stack(out)
        return (out, np.stack(densities)) if log_density else out

    # ---- meta-training --------------------------------------------------------------------------------
    def meta_fit(
        self,
        problem,
        iterations=1000,
        tasks_per_iteration=8,
        num_particles=128,
        sequence_length=10,
        segment_length=None,
        segment_prior="exact",
        learning_rate=1e-3,
        weight_decay=1e-5,
        seed=0,
        verbose=1,
    ):
        """Meta-trains the operator on tasks drawn from `problem` (Section 3.3): per iteration,
        `tasks_per_iteration` tasks with `sequence_length` observations each, `num_particles` particles
        per task, one Adam step per segment of `segment_length` stages (default: the whole sequence).
        Later calls continue training (same Adam state, this call's learning rate).

        `segment_prior` (static latents): the target of a later segment's stages is the task's prior
        times all observations so far ("exact"), or the paper's data-driven prior (Eq. 18-20): a
        Gaussian KDE (Silverman bandwidth) of the particles at the segment's start times the
        segment's observations only ("kde": no stored past observations, for long streams).
        Returns a keras History-like dict {"loss": [per-iteration mean stage loss]}."""
        if not isinstance(problem, SequentialProblem):
            raise TypeError(
                f"ParticleFlowBayesRule.meta_fit: problem must be a bayes_keras.pfbr.SequentialProblem; "
                f"got {type(problem).__name__}."
            )
        if problem.latent_dim != self.latent_dim:
            raise ValueError(
                f"ParticleFlowBayesRule.meta_fit: the problem's latent dimension is {problem.latent_dim}, "
                f"the operator's is {self.latent_dim}."
            )
        for name, value, least in (
            ("iterations", iterations, 1),
            ("tasks_per_iteration", tasks_per_iteration, 1),
            ("num_particles", num_particles, 2),
            ("sequence_length", sequence_length, 1),
            ("segment_length", sequence_length if segment_length is None else segment_length, 1),
        ):
            if not _integer_at_least(value, least):
                raise ValueError(
                    f"ParticleFlowBayesRule.meta_fit: {name} must be an integer >= {least}; got {value!r}."
                )
        if not _positive_number(learning_rate):
            raise ValueError(
                f"ParticleFlowBayesRule.meta_fit: learning_rate must be a positive number; got {learning_rate!r}."
            )
        if not (_positive_number(weight_decay) or weight_decay == 0):
            raise ValueError(
                f"ParticleFlowBayesRule.meta_fit: weight_decay must be a number >= 0; got {weight_decay!r}."
            )
        if segment_prior not in ("exact", "kde"):
            raise ValueError(
                f"ParticleFlowBayesRule.meta_fit: segment_prior must be 'exact' or 'kde'; got {segment_prior!r}."
            )
        segment_length = int(segment_length or sequence_length)
        if getattr(self, "optimizer", None) is None:
            self.compile(optimizer=keras.optimizers.Adam(learning_rate, weight_decay=weight_decay))
            self.optimizer.build(self.trainable_variables)
        else:  # a later call continues with the same Adam state at this call's learning rate
            self.optimizer.learning_rate.assign(learning_rate)
        rng = np.random.default_rng(seed)
        for use_kde in (False, True):
            if (id(problem), use_kde) not in self._compiled_train:
                self._compiled_train[(id(problem), use_kde)] = self._train_segment_function(
                    problem, use_kde
                )
        bar = keras.utils.Progbar(iterations, stateful_metrics=["loss"]) if verbose else None
        history = {"loss": []}
        m = problem.observations_per_update
        for iteration in range(int(iterations)):
            task, observations = problem.sample_tasks(tasks_per_iteration, sequence_length, rng)
            task = problem.as_task_tensors(task)
            observations = tf.convert_to_tensor(observations, tf.float32)
            flat_observations = tf.reshape(
                observations, [tasks_per_iteration, sequence_length * m, -1]
            )
            stage_seeds = rng.integers(0, 2**31 - 1, size=(sequence_length + 1, 2))
            particles, density = problem.sample_prior(task, num_particles, stage_seeds[-1])
            losses = []
            for start in range(0, sequence_length, segment_length):
                stop = min(start + segment_length, sequence_length)
                use_kde = segment_prior == "kde" and start > 0 and not problem.state_space
                index = np.arange(sequence_length * m)[None, :]
                masks = (index < (np.arange(start, stop)[:, None] + 1) * m) & (
                    index >= (start * m if use_kde else 0)
                )
                masks = np.broadcast_to(
                    masks[:, None, :], (stop - start, tasks_per_iteration, sequence_length * m)
                )
                loss, particles, density = self._compiled_train[(id(problem), use_kde)](
                    particles,
                    density,
                    observations[:, start:stop],
                    flat_observations,
                    tf.constant(masks, tf.float32),
                    task,
                    tf.constant(stage_seeds[start:stop], tf.int32),
                )
                losses.append(float(loss) * (stop - start))
            loss = sum(losses) / sequence_length
            if not np.isfinite(loss):
                raise FloatingPointError(
                    f"ParticleFlowBayesRule.meta_fit: the loss became {loss} at iteration "
                    f"{iteration}; lower learning_rate or raise steps."
                )
            history["loss"].append(loss)
            if bar is not None:
                bar.update(iteration + 1, values=[("loss", loss)])
        return history

    def _train_segment_function(self, problem, use_kde):
        @tf.function(reduce_retracing=True)
        def train_segment(particles, density, observations, flat_observations, masks, task, seeds):
            count = observations.shape[1]
            if use_kde:
                segment_start = tf.stop_gradient(particles)
                log_prior = lambda x: gaussian_kde_log_prob(x, segment_start)  # noqa: E731
            else:
                log_prior = lambda x: problem.log_prior(x, task)  # noqa: E731

            def stage(i, particles, density, total):
                observation = observations[:, i]
                particles, density, previous = self._stage(
                    problem, particles, density, observation, task, seeds[i]
                )
                if problem.state_space:
                    target = problem.log_likelihood(
                        particles, observation, task
                    ) + problem.log_transition_mixture(particles, previous, task)
                else:
                    target = log_prior(particles) + problem.log_likelihood(
                        particles, flat_observations, task, mask=masks[i]
                    )
                return i + 1, particles, density, total + tf.reduce_mean(density - target)

            with tf.GradientTape() as tape:
                _, particles, density, total = tf.while_loop(
                    lambda i, *_: i < count,
                    stage,
                    (tf.constant(0), particles, density, tf.constant(0.0)),
                    maximum_iterations=count,
                )
                loss = total / count
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            return loss, tf.stop_gradient(particles), tf.stop_gradient(density)

        return train_segment

    def get_config(self):
        return {
            **super().get_config(),
            "latent_dim": self.latent_dim,
            "hidden_units": self.hidden_units,
            "embedding_units": self.embedding_units,
            "body_layers": self.body_layers,
            "time_length": self.time_length,
            "steps": self.steps,
            "divergence": self.divergence,
            "standardize": self.standardize,
            "likelihood_value": self.likelihood_value,
        }


class _StandardCoordinates:
    """x = m + L z for a stage's starting particles (B, N, d): L = diag(per-coordinate sd) (True), the
    Cholesky factor of their covariance ("full"), or the identity with m = 0 (False). Gradients in z are
    L^T g, Hessians L^T H L. Bayes' rule commutes with the map, and a flow's divergence is the same in
    both coordinates (log |det L| is constant within the stage)."""

    def __init__(self, start, mode):
        self.mode = mode
        if mode is False:
            self.center, self.scale = tf.zeros_like(start[:, :1]), tf.ones_like(start[:, :1])
            return
        self.center = tf.reduce_mean(start, axis=1, keepdims=True)
        if mode is True:
            # (B, 1, d)
            self.scale = tf.sqrt(tf.math.reduce_variance(start, axis=1, keepdims=True) + 1e-12)
            return
        deviations = start - self.center
        d = start.shape[-1]
        covariance = tf.matmul(deviations, deviations, transpose_a=True) / tf.cast(
            tf.shape(start)[1], start.dtype
        )
        # A relative jitter keeps the factor finite for particles on a line (or a single repeated point).
        jitter = 1e-6 * tf.linalg.trace(covariance)[:, None, None] / d + 1e-12
        # (B, d, d)
        self.factor = tf.linalg.cholesky(covariance + jitter * tf.eye(d, dtype=start.dtype))

    def to_z(self, x):
        if self.mode != "full":
            return (x - self.center) / self.scale
        solved = tf.linalg.triangular_solve(
            self.factor, tf.linalg.matrix_transpose(x - self.center), lower=True
        )
        return tf.linalg.matrix_transpose(solved)

    def to_x(self, z):
        if self.mode != "full":
            return z * self.scale + self.center
        return tf.matmul(z, self.factor, transpose_b=True) + self.center

    def gradient(self, g):
        return g * self.scale if self.mode != "full" else tf.matmul(g, self.factor)

    def hessian(self, h):
        """(B, N, d, d) Hessians in x -> in z."""
        if self.mode != "full":
            return h * self.scale[..., :, None] * self.scale[..., None, :]
        factor = self.factor[:, None]
        return tf.matmul(tf.matmul(factor, h, transpose_a=True), factor)


def gaussian_kde_log_prob(x, centers):
    """log (1/N) sum_j N(x; c_j, diag(h^2)) with Silverman's per-coordinate bandwidth
    h = (4 / (d + 2))^(1 / (d + 4)) N^(-1 / (d + 4)) sd(centers): the paper's data-driven prior (Eq. 18).
    x (B, M, d), centers (B, N, d) -> (B, M)."""
    n = tf.cast(tf.shape(centers)[1], x.dtype)
    d = x.shape[-1]
    h = (4.0 / (d + 2)) ** (1.0 / (d + 4)) * n ** (-1.0 / (d + 4)) * tf.math.reduce_std(
        centers, axis=1, keepdims=True
    ) + 1e-6
    z = (x[:, :, None, :] - centers[:, None, :, :]) / h[:, None]
    log_kernel = (
        -0.5 * tf.reduce_sum(tf.square(z), -1)
        - tf.reduce_sum(tf.math.log(h), -1)[:, None]
        - 0.5 * d * np.log(2 * np.pi)
    )
    return tf.reduce_logsumexp(log_kernel, axis=-1) - tf.math.log(n)


def _integer_at_least(value, least):
    return (
        isinstance(value, (int, np.integer))
        and not isinstance(value, (bool, np.bool_))
        and value >= least
    )


def _positive_number(value):
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and bool(np.isfinite(value))
        and value > 0
    )


def _check_finite(name, tensor, cause=""):
    """Raises on NaN / inf in an eager tensor (no check while tracing: the values do not exist yet)."""
    if tf.executing_eagerly() and not bool(tf.reduce_all(tf.math.is_finite(tensor))):
        raise ValueError(f"ParticleFlowBayesRule: {name} hold non-finite values{cause}.")


def _check_log_likelihood(log_likelihood, particles):
    """Evaluates `log_likelihood` once at the particles: one finite value per particle, depending on it."""
    if not callable(log_likelihood):
        raise TypeError(
            f"ParticleFlowBayesRule: log_likelihood must be a callable x -> log p(o | x); got "
            f"{type(log_likelihood).__name__}."
        )
    if not tf.executing_eagerly():
        return
    with tf.GradientTape() as tape:
        tape.watch(particles)
        value = log_likelihood(particles)
    expected = tuple(particles.shape[:-1])
    if not isinstance(value, (tf.Tensor, tf.Variable)) or tuple(value.shape) != expected:
        raise ValueError(
            f"ParticleFlowBayesRule: log_likelihood(x) must return a TensorFlow tensor of shape {expected}, one "
            f"value per particle of x {tuple(particles.shape)}; got "
            f"{tuple(value.shape) if hasattr(value, 'shape') else type(value).__name__}"
            f"{'' if isinstance(value, (tf.Tensor, tf.Variable)) else ' (not a tf tensor: gradients cannot flow)'}."
        )
    if tape.gradient(value, particles) is None:
        raise ValueError(
            "ParticleFlowBayesRule: log_likelihood(x) does not depend on x through TensorFlow ops (its "
            "gradient is None); write it with tf ops on x."
        )
    if not bool(tf.reduce_all(tf.math.is_finite(value))):
        raise ValueError(
            "ParticleFlowBayesRule: log_likelihood(x) is not finite at every particle (a NaN or extreme "
            "observation?)."
        )
