"""MGVBP: natural-gradient Gaussian VI on the precision matrix (Magris, Shabani, Iosifidis)."""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from bayes_keras._config import check_number
from bayes_keras.inference import mgvbp as core
from bayes_keras.optimizers.gaussian_variational_optimizer import GaussianVariationalOptimizer
from bayes_keras.optimizers.particle_view import ParticleView

tfd = tfp.distributions

_STRUCTURES = ("full", "layer", "kronecker", "diagonal")
_ESTIMATORS = ("gradient", "score", "score_h")
_CURVATURES = ("stein", "empirical_fisher", "fisher")
_FISHERS = ("empirical_fisher", "fisher")


def _current(variable):
    return variable.value


@keras.saving.register_keras_serializable(package="bayes_keras")
class MGVBP(GaussianVariationalOptimizer):
    """Manifold Gaussian Variational Bayes on the Precision matrix: q = N(mu, P^-1) moved by natural
    gradients, P retracted on the positive-definite manifold, momentum carried by vector transport.

    Each step: the model's N particles are samples from q; from their gradients (or log likelihoods)
    the natural gradients of the lower bound are estimated, then

        m <- omega T(m) + (1 - omega) natgrad ;  mu <- mu + beta m_mu ;  P <- P + xi + 1/2 xi P^-1 xi,
        xi = beta m_P  (halved up to `max_halvings` times if round-off broke positive definiteness),

    and N new samples are written into the particle variables.

    Estimators (`estimator=`):
      "gradient": reparameterisation / Price-Stein estimator from the per-sample gradients of the
          log joint (nat_mu = Sigma E[g], nat_P = -sym(P E[a g^T]) - P). An extension for networks,
          not in the paper; the only practical one beyond a few hundred weights. Default.
      "score": the paper's default estimator: score function of the log LIKELIHOOD with the Gaussian
          prior (zero-mean Normal priors of the layers) and the entropy in closed form, with
          per-coordinate control variates from the previous step's samples.
      "score_h": the paper's fully black-box form on h = log p(y, w) - log q(w).
    The score-function forms need O(S D^2) memory per step with full P: tens of weights.

    Curvature of the "gradient" estimator (`curvature=`), the target that P is moved toward:
      "stein": -E_q[hess] = -P Cov(theta, g) (Stein's lemma), unbiased; exact on conjugate models.
          Noisy and indefinite on networks with few samples: a large negative estimate makes the
          retraction's xi^2 / (2p) term inflate p, and the run diverges (seen on LeNet-5).
      "empirical_fisher": the diagonal of the per-example empirical Fisher, sum_i (d log p(y_i|w) / dw)^2,
          averaged over the N samples, plus the Normal prior's precision exactly: the curvature of
          VOGN (Khan et al. 2018; Osawa et al. 2019), computed from the layers' inputs and
          pre-activation gradients captured in the same backward pass (bayes_keras.curvature).
          Never negative: use it (or "fisher") for deep networks. structure="diagonal" only; needs
          Normal priors (the default) and Dense / Conv2D particle layers.
      "fisher": as "empirical_fisher" but with labels sampled from the model's own predictive (one
          per example and sample of q): a Monte Carlo estimate of the true Fisher (the generalised
          Gauss-Newton for these likelihoods) diagonal. Costs a second backward pass to the
          pre-activations; unlike the empirical Fisher it does not shrink with the residuals.

    Args:
        learning_rate: beta (float or schedule; the paper's schedule is
            `bayes_keras.schedules.ConstantThenInverseTime(beta, tau)`).
        mean_learning_rate: step size of mu (float or schedule); None (default) uses `learning_rate`
            for both, as the paper does. An extension for networks, after VOGN's separate mean and
            precision rates: a precision that moves slower than the mean keeps the noise of q small
            while the network is still untrained (on LeNet-5, equal rates let the variance grow
            before the mean had learned anything, and one seed of three ended as a dead network).
        structure: "full" (one D x D precision), "layer" (one full block per layer), "kronecker" (per
            Dense / Conv2D layer P = A (x) G over its [kernel; bias] matrix, KFAC's factors from
            bayes_keras.curvature: the mean steps by P^-1 E[g] through the factors, each factor is
            retracted toward the batch's factors damped by the prior precision / T (pi split), no
            momentum on the factors; needs curvature "empirical_fisher" or "fisher"; an extension in
            the spirit of Noisy K-FAC, not in the paper) or "diagonal".
        estimator: "gradient" | "score" | "score_h" (see above).
        curvature: "stein" | "empirical_fisher" | "fisher", for estimator="gradient" (see above).
        momentum: omega in m <- omega T(m) + (1 - omega) natgrad (paper: 0.4). The first step sets m
            to the natural gradient.
        initial_precision: P at the start, times the identity (paper: 1 / s0 = 10). mu starts at
            the first particle's initial weights (or at `model.initialize_particles` values).
        max_halvings: retraction step halvings tried before a step of P is dropped.
        gradient_clip: if set, the stacked natural gradient (mu, P) of each block is scaled to at
            most this norm (the paper's GradientMax = 100); not for structure="kronecker".
        max_block_size: a full block larger than this raises an error (O(D^3) per step).
        antithetic: draw the samples of q in mirrored pairs mu +- a (even sample counts; odd counts
            draw independently): half the random numbers, which dominated the cost of a step on
            CPU, and exact cancellation of the mean gradient's odd part; but a second moment of the
            draws (the Stein and score curvatures) then sees only S / 2 independent draws. None
            (default): True for the Fisher curvatures, False for "stein" and the score estimators.
        seed: seed of the sample stream (draws are keyed by (seed, counter), so a resumed run
            samples what an uninterrupted one would).

    Example:
        >>> model.compile(optimizer=bayes_keras.optimizers.MGVBP(1e-2, structure="diagonal"))
        >>> q = model.optimizer.posterior()   # tfd distribution over the flattened weights
    """

    def __init__(self, learning_rate=1e-2, structure="diagonal", estimator="gradient", curvature="stein",
                 momentum=0.4, initial_precision=10.0, max_halvings=5, gradient_clip=None, max_block_size=2000, seed=None,
                 mean_learning_rate=None, **kwargs):
        if structure not in _STRUCTURES:
            raise ValueError(f"MGVBP structure must be one of {_STRUCTURES}; got {structure!r}.")
        if estimator not in _ESTIMATORS:
            raise ValueError(f"MGVBP estimator must be one of {_ESTIMATORS}; got {estimator!r}.")
        if curvature not in _CURVATURES:
            raise ValueError(f"MGVBP curvature must be one of {_CURVATURES}; got {curvature!r}.")
        if curvature in _FISHERS and structure not in ("diagonal", "kronecker"):
            raise ValueError(f"MGVBP curvature={curvature!r} is implemented for structure='diagonal' and "
                             f"'kronecker'; got structure={structure!r}.")
        if structure == "kronecker" and curvature not in _FISHERS:
            raise ValueError("MGVBP structure='kronecker' moves P toward KFAC factors: it needs "
                             f"curvature='empirical_fisher' or 'fisher'; got curvature={curvature!r}.")
        if curvature != "stein" and estimator != "gradient":
            raise ValueError(f"MGVBP curvature={curvature!r} belongs to estimator='gradient'; the score "
                             f"estimators estimate the curvature themselves (got estimator={estimator!r}).")
        if structure == "kronecker" and gradient_clip is not None:
            raise ValueError("MGVBP gradient_clip is not implemented for structure='kronecker'; got "
                             f"gradient_clip={gradient_clip!r}.")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"MGVBP momentum (omega) must be in [0, 1); got {momentum!r}.")
        if not initial_precision > 0:
            raise ValueError(f"MGVBP initial_precision must be positive; got {initial_precision!r}.")
        super().__init__(learning_rate=learning_rate, seed=seed, **kwargs)
        self.structure = structure
        self.estimator = estimator
        self.curvature = curvature
        self.momentum = float(momentum)
        self.initial_precision = float(initial_precision)
        self.max_halvings = int(max_halvings)
        self.gradient_clip = None if gradient_clip is None else float(gradient_clip)
        self.max_block_size = int(max_block_size)
        if isinstance(mean_learning_rate, dict):
            mean_learning_rate = keras.optimizers.schedules.deserialize(mean_learning_rate)
        if not isinstance(mean_learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            mean_learning_rate = check_number(mean_learning_rate, "MGVBP mean_learning_rate (None: learning_rate)",
                                              allow_none=True)
        self.mean_learning_rate = mean_learning_rate

    @property
    def _diagonal(self):
        return self.structure == "diagonal"

    @property
    def _antithetic_by_default(self):
        # Stein and score curvatures are second moments of the draws: mirrored pairs would halve
        # their effective sample size (measured: 2x the precision error on a conjugate model).
        return self.curvature in _FISHERS

    @property
    def _elementwise(self):
        return self._diagonal and self.estimator == "gradient"

    @property
    def _kronecker(self):
        return self.structure == "kronecker"

    @property
    def _diagonal_posterior(self):
        return self._diagonal

    # -- blocks --------------------------------------------------------------------------------
    def _block_groups(self, view):
        # full: one block; layer / kronecker: one per layer; diagonal: one flat block (elementwise anyway)
        return view.partition("layer" if self.structure in ("layer", "kronecker") else "joint")

    def build(self, variables):
        if self.built:
            return
        view = ParticleView(variables)  # the checks run before any variable is created
        if self._kronecker:
            self._build_kronecker_shapes(view)
        elif not self._diagonal:
            pvars = view.variables
            for g in self._block_groups(view):
                dim = sum(view.sizes[i] for i in g)
                if dim > self.max_block_size:
                    names = ", ".join(pvars[i].path for i in g)
                    raise ValueError(
                        f"MGVBP structure='{self.structure}' needs a {dim} x {dim} precision block for "
                        f"[{names}], above max_block_size={self.max_block_size} (O(D^3) per step). Use "
                        "structure='layer' (one block per layer) or structure='diagonal' for a model this "
                        "large, or raise max_block_size.")
        super().build(variables)

    def _build_kronecker_shapes(self, view):
        """Each block is one Dense / Conv2D layer's [kernel; bias] as a (p, q) matrix (KFAC's view)."""
        from bayes_keras.curvature.kfac import candidate_specs  # noqa: I001 (layers import curvature)

        pvars = view.variables
        self._kron_shapes, self._kron_index = [], {}
        for j, g in enumerate(self._block_groups(view)):
            group = [pvars[i] for i in g]
            names = ", ".join(v.path for v in group)
            try:
                spec = candidate_specs(group)[0]
            except ValueError as error:
                raise ValueError(f"MGVBP structure='kronecker' needs Dense or Conv2D particle layers; [{names}]: "
                                 f"{error} Use structure='diagonal' for this model.") from None
            if spec.kind not in ("Dense", "Conv2D"):
                raise ValueError(f"MGVBP structure='kronecker' supports Dense and Conv2D particle layers; [{names}] "
                                 f"is a {spec.kind}. Use structure='diagonal' for this model.")
            if spec.variables != group:  # the flat block must be [kernel, bias], KFAC's row order
                raise ValueError(f"MGVBP structure='kronecker': expected the variables of [{names}] in the order "
                                 f"{[v.path for v in spec.variables]}.")
            p, q = spec.block_shape(spec.blocks[0])
            if max(p, q) > self.max_block_size:
                raise ValueError(f"MGVBP structure='kronecker' needs a {max(p, q)} x {max(p, q)} factor for "
                                 f"[{names}], above max_block_size={self.max_block_size}. Use "
                                 "structure='diagonal', or raise max_block_size.")
            self._kron_shapes.append((p, q))
            self._kron_index[g[0]] = j  # keyed by the view index of the layer's kernel

    def _build_block(self, j, dim):
        if self._kronecker:
            p, q = self._kron_shapes[j]
            return {"mean": self._var((dim,), f"block{j}_mean"), "m_mean": self._var((dim,), f"block{j}_m_mean"),
                    "factor_a": self._var((p, p), f"block{j}_factor_a"),
                    "factor_g": self._var((q, q), f"block{j}_factor_g")}
        p_shape = (dim,) if self._diagonal else (dim, dim)
        state = {"mean": self._var((dim,), f"block{j}_mean"), "precision": self._var(p_shape, f"block{j}_precision"),
                 "m_mean": self._var((dim,), f"block{j}_m_mean"), "m_precision": self._var(p_shape, f"block{j}_m_precision")}
        if self.estimator != "gradient":
            state["c_mean"] = self._var((dim,), f"block{j}_c_mean")
            state["c_precision"] = self._var(p_shape, f"block{j}_c_precision")
        return state

    def _initialize_block(self, j, mean):
        state = self._state[j]
        state["mean"].assign(mean)
        if self._kronecker:  # P = A (x) G = initial_precision I
            root = np.sqrt(self.initial_precision)
            for name in ("factor_a", "factor_g"):
                state[name].assign(root * tf.eye(state[name].shape[0], dtype=self.posterior_dtype))
            return
        dim = mean.shape[0]
        p0 = self.initial_precision * (tf.ones(dim, self.posterior_dtype) if self._diagonal
                                       else tf.eye(dim, dtype=self.posterior_dtype))
        state["precision"].assign(p0)

    # -- the Gaussian --------------------------------------------------------------------------
    def _kron_cholesky(self, j, read=_current):
        s = self._state[j]
        return tf.linalg.cholesky(read(s["factor_a"])), tf.linalg.cholesky(read(s["factor_g"]))

    def _block_sample(self, j, eps, read=_current):
        s = self._state[j]
        if self._kronecker:
            return core.sample_kronecker(read(s["mean"]), *self._kron_cholesky(j, read), eps)
        if self._diagonal:
            return core.sample_diag(read(s["mean"]), read(s["precision"]), eps)
        return core.sample_full(read(s["mean"]), read(s["precision"]), eps)

    def _block_entropy(self, j):
        if self._kronecker:
            return core.entropy_kronecker(*self._kron_cholesky(j))
        p = self._state[j]["precision"].value
        return core.entropy_diag(p) if self._diagonal else core.entropy_full(p)

    def _kron_scales(self, j, rows=None):
        """Lower-triangular square roots of the row and column covariances A^-1, G^-1 (rows: a row range)."""
        s = self._state[j]
        cov_a, cov_g = tf.linalg.inv(s["factor_a"].value), tf.linalg.inv(s["factor_g"].value)
        if rows is not None:
            cov_a = cov_a[rows[0]:rows[1], rows[0]:rows[1]]
        return (tf.linalg.LinearOperatorLowerTriangular(tf.linalg.cholesky(cov_a)),
                tf.linalg.LinearOperatorLowerTriangular(tf.linalg.cholesky(cov_g)))

    def _block_distribution(self, j):
        s = self._state[j]
        if self._kronecker:  # row-major vec: Cov = A^-1 (x) G^-1
            return tfd.MultivariateNormalLinearOperator(
                s["mean"].value, tf.linalg.LinearOperatorKronecker(list(self._kron_scales(j))))
        if self._diagonal:
            return tfd.Independent(tfd.Normal(s["mean"].value, tf.math.rsqrt(s["precision"].value)), 1)
        return tfd.MultivariateNormalTriL(s["mean"].value, _covariance_cholesky(s["precision"].value))

    def _marginal(self, j, offset, size):
        s = self._state[j]
        mean = s["mean"].value[offset:offset + size]
        if self._kronecker:  # a variable is a range of whole rows of the block's matrix
            q = self._kron_shapes[j][1]
            rows = (offset // q, (offset + size) // q)
            return tfd.MultivariateNormalLinearOperator(
                mean, tf.linalg.LinearOperatorKronecker(list(self._kron_scales(j, rows))))
        if self._diagonal:
            return tfd.Independent(tfd.Normal(mean, tf.math.rsqrt(s["precision"].value[offset:offset + size])), 1)
        cov = tf.linalg.inv(s["precision"].value)[offset:offset + size, offset:offset + size]
        return tfd.MultivariateNormalTriL(mean, tf.linalg.cholesky(cov))

    @property
    def _prior_user(self):
        return "estimator='score'" if self.estimator == "score" else f"curvature='{self.curvature}'"

    def _prior_vectors(self, block):
        """(mean, precision) vectors of the layers' zero-mean Normal priors over a block's coordinates."""
        from bayes_keras.priors import Normal

        means, precisions = [], []
        for i in block:
            if self.view.priors[i] is None:
                raise ValueError(f"MGVBP {self._prior_user} needs the layers' priors; "
                                 f"{self.view.variables[i].path} belongs to no bayes_keras particle layer.")
            prior, fan_in = self.view.priors[i]
            if not isinstance(prior, Normal):
                raise ValueError(f"MGVBP {self._prior_user} handles Normal priors in closed form; "
                                 f"{self.view.variables[i].path} has {prior!r}. Use estimator='score_h', or "
                                 "estimator='gradient' with curvature='stein'.")
            sd = prior.stddev(fan_in)
            means.append(tf.fill((self.view.sizes[i],), tf.constant(prior.loc, self.posterior_dtype)))
            precisions.append(tf.fill((self.view.sizes[i],), tf.constant(1.0 / sd ** 2, self.posterior_dtype)))
        return tf.concat(means, 0), tf.concat(precisions, 0)

    def check_num_particles(self, num_particles):
        super().check_num_particles(num_particles)
        if num_particles < 2 and self.curvature not in _FISHERS:
            what = "the Stein curvature (a sample covariance)" if self.estimator == "gradient" else "control variates"
            raise ValueError(f"MGVBP estimator={self.estimator!r} needs at least 2 samples of q per step for "
                             f"{what}; got num_particles={num_particles}. Use more particles, or "
                             "curvature='empirical_fisher'.")

    # -- curvature (curvature="empirical_fisher" | "fisher") ------------------------------------------
    @property
    def curvature_request(self):
        """What BayesianModel must capture for this optimizer (None: nothing)."""
        if self.curvature not in _FISHERS:
            return None
        kind = "kfac" if self._kronecker else "per_example_diagonal"
        return f"{kind}_true_fisher" if self.curvature == "fisher" else kind

    def _records(self, step):
        if step is None or not step.curvature:
            raise ValueError(f"MGVBP curvature={self.curvature!r} needs the layers' captured curvature: train "
                             "through BayesianModel.fit, or pass the step of model.bayesian_gradients to apply().")
        return step.curvature

    def _tempered_prior_precision(self, block, step):
        """The Normal priors' precisions over a block's coordinates divided by the posterior temperature
        (the part of the Fisher curvatures' target that the data does not give)."""
        return self._prior_vectors(block)[1] / tf.cast(step.temperature, self.posterior_dtype)

    def _fisher_diagonal(self, block, step):
        """Tempered, data-set-scaled empirical Fisher diagonal over a block's coordinates, E_q by the
        mean over the N samples."""
        from bayes_keras.curvature import per_example_squared_gradients  # noqa: I001 (layers import curvature)

        labels = "sampled" if self.curvature == "fisher" else "observed"
        fisher = {}
        for r in self._records(step):
            for variable, squares in per_example_squared_gradients(r, labels):
                flat = tf.reshape(tf.cast(squares, self.posterior_dtype), (self.view.num_particles, -1))
                fisher[self.view.index(variable)] = (tf.cast(r.dataset_scale, self.posterior_dtype)
                                                     * tf.reduce_mean(flat, 0))
        pieces = []
        for i in block:
            if i not in fisher:
                raise ValueError(f"MGVBP curvature={self.curvature!r}: no curvature was captured for "
                                 f"{self.view.variables[i].path} (supported: Dense and Conv2D particle layers).")
            pieces.append(fisher[i])
        return pieces[0] if len(pieces) == 1 else tf.concat(pieces, 0)

    # -- the update ----------------------------------------------------------------------------
    def _values(self, step):
        if step is None:
            raise ValueError(f"MGVBP estimator='{self.estimator}' needs the per-sample log likelihoods: train "
                             "through BayesianModel.fit, or pass the step of model.bayesian_gradients to apply().")
        return (tf.cast(step.log_likelihood, self.posterior_dtype), tf.cast(step.log_prior, self.posterior_dtype))

    def _natural_gradient(self, j, theta, grad, state, step, writes):
        mean, prec = state["mean"].value, state["precision"].value
        diag = self._diagonal
        if self.estimator == "gradient":  # full or layer blocks (diagonal: _update_elementwise)
            return core.reparam_natural_gradient_full(theta, mean, prec, grad,
                                                      antithetic=self._antithetic_for(self.view.num_particles))
        log_lik, log_prior = self._values(step)
        fn = core.score_natural_gradient_diag if diag else core.score_natural_gradient_full
        c_mu, c_p = state["c_mean"].value, state["c_precision"].value
        if self.estimator == "score":
            prior_mean, prior_prec = self._prior_vectors(self._blocks[j])
            nat_mu, nat_p, new_c_mu, new_c_p = fn(theta, mean, prec, log_lik, c_mu, c_p, prior_mean,
                                                 prior_prec / step.temperature)
        else:
            log_q = core.log_q_diag(theta, mean, prec) if diag else core.log_q_full(theta, mean, prec)
            h = log_lik + log_prior - log_q
            nat_mu, nat_p, new_c_mu, new_c_p = fn(theta, mean, prec, h, c_mu, c_p)
        writes.assign(state["c_mean"], new_c_mu)
        writes.assign(state["c_precision"], new_c_p)
        return nat_mu, nat_p

    def _mean_step_size(self, learning_rate, iteration):
        lr = self.mean_learning_rate
        if lr is None:
            return learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            lr = lr(iteration - 1.0)
        return tf.cast(lr, self.posterior_dtype)

    def _kronecker_targets(self, step):
        """Per block, the damped KFAC factors (A_hat, G_hat) that P moves toward: this batch's factors
        (dataset scale and temperature in G), E_q by the mean over the samples, with the prior precision
        / T as factored damping (the kernel's prior; bias rows share it)."""
        from bayes_keras.curvature.kfac import kfac_factors  # noqa: I001 (layers import curvature)

        fisher = "true" if self.curvature == "fisher" else "empirical"
        targets = [None] * len(self._blocks)
        for r in self._records(step):
            j = self._kron_index.get(self.view.index(r.layer.kernel))
            if j is None:
                continue
            factors = kfac_factors(r, fisher)
            a = tf.reduce_mean(tf.cast(factors["A"], self.posterior_dtype), 0)
            g = tf.reduce_mean(tf.cast(factors["G"], self.posterior_dtype), 0)
            targets[j] = core.damped_kronecker_factors(a, g, self._tempered_prior_precision(self._blocks[j], step)[0])
        for j, t in enumerate(targets):
            if t is None:
                raise ValueError(f"MGVBP structure='kronecker': no curvature was captured for "
                                 f"{self.view.variables[self._blocks[j][0]].path}.")
        return targets

    def _update_kronecker(self, grads, learning_rate, mean_lr, omega, step, writes):
        """Mean: the natural gradient P^-1 E[g] through the factors. Precision: MGVBP's retraction on
        each factor toward the damped batch factors (no momentum on the factors), then rebalanced."""
        for j, (grad, (a_hat, g_hat)) in enumerate(zip(grads, self._kronecker_targets(step))):
            s = self._state[j]
            old_a, old_g, old_mu = s["factor_a"].value, s["factor_g"].value, s["mean"].value
            chol_a, chol_g = tf.linalg.cholesky(old_a), tf.linalg.cholesky(old_g)
            nat_mu = core.kronecker_solve(chol_a, chol_g, tf.reduce_mean(grad, axis=0))
            m_mu = omega * s["m_mean"].value + (1.0 - omega) * nat_mu
            new_mu = old_mu + mean_lr * m_mu
            new = []
            for old, chol, target in ((old_a, chol_a, a_hat), (old_g, chol_g, g_hat)):
                retract = lambda p, xi, chol=chol: core.retract_full(p, xi, chol)  # noqa: E731
                factor, _ = core.retract_with_halving(old, learning_rate * (target - old), retract,
                                                      core.is_positive_definite_full, self.max_halvings)
                new.append(factor)
            new_a, new_g = core.balance_factors(*new)
            for name, value in (("mean", new_mu), ("m_mean", m_mu), ("factor_a", new_a), ("factor_g", new_g)):
                writes.assign(s[name], value)

    def _momentum_at(self, iteration):
        first = tf.equal(iteration, 1.0)  # the first step sets m to the natural gradient
        return tf.where(first, tf.constant(0.0, self.posterior_dtype), tf.constant(self.momentum, self.posterior_dtype))

    def _elementwise_moments(self, read):
        s = self._state[0]
        return read(s["mean"]), tf.math.rsqrt(read(s["precision"]))

    def _update_elementwise(self, thetas, loss_grads, learning_rate, iteration, step, writes):
        """Diagonal structure with the gradient estimator, per particle variable on slices of the flat
        state. loss_grads are gradients of -log p(y, theta): E[g_logjoint] = -E[g], and
        nat_P = -p Cov(a, g_logjoint) - p = p Cov(a, g) - p."""
        s = self._state[0]
        mean, prec = s["mean"].value, s["precision"].value
        if self.curvature in _FISHERS:
            mean_loss_grad = tf.concat([tf.reduce_sum(g, axis=0) for g in loss_grads], 0) / float(self.view.num_particles)
            nat_p = self._fisher_target(0, step) - prec
        else:  # per-variable sums, then the moments once on the concatenated (D,) sums
            sums = [], [], []
            for m, theta, g in zip(tf.split(mean, self.view.sizes), thetas, loss_grads):
                a = theta - m
                for out, t in zip(sums, (a, g, a * g)):
                    out.append(tf.reduce_sum(t, axis=0))
            mean_loss_grad, cov = core.diagonal_moments_from_sums(
                *(tf.concat(t, 0) for t in sums), self.view.num_particles,
                self._antithetic_for(self.view.num_particles))
            nat_p = prec * cov - prec
        self._step_block(s, -mean_loss_grad / prec, nat_p, learning_rate,
                         self._mean_step_size(learning_rate, iteration), self._momentum_at(iteration), writes)

    def _fisher_target(self, j, step):
        """The curvature that P moves toward under curvature="empirical_fisher" | "fisher": the Fisher
        diagonal plus the prior precision / T."""
        block = self._blocks[j]
        return self._fisher_diagonal(block, step) + self._tempered_prior_precision(block, step)

    def _update_blocks(self, thetas, grads, learning_rate, iteration, step, writes):
        mean_lr = self._mean_step_size(learning_rate, iteration)
        omega = self._momentum_at(iteration)
        if self._kronecker:
            return self._update_kronecker(grads, learning_rate, mean_lr, omega, step, writes)
        for j, (theta, grad) in enumerate(zip(thetas, grads)):
            s = self._state[j]
            nat_mu, nat_p = self._natural_gradient(j, theta, grad, s, step, writes)
            self._step_block(s, nat_mu, nat_p, learning_rate, mean_lr, omega, writes)

    def _step_block(self, s, nat_mu, nat_p, learning_rate, mean_lr, omega, writes):
        """Momentum, the mean step and the retraction of P for one block's natural gradients."""
        if self.gradient_clip is not None:
            nat_mu, nat_p = core.clip_by_norm(nat_mu, nat_p, self.gradient_clip)
        m_mu = omega * s["m_mean"].value + (1.0 - omega) * nat_mu
        m_p = omega * s["m_precision"].value + (1.0 - omega) * nat_p
        old_p, old_mu = s["precision"].value, s["mean"].value
        new_mu = old_mu + mean_lr * m_mu
        if self._diagonal:
            # Elementwise: the retraction ((p + xi)^2 + p^2) / (2p) is positive for any xi, so no
            # halving; a coordinate whose update overflows keeps its old state.
            new_p = core.retract_diag(old_p, learning_rate * m_p)
            new_m_p = core.transport_diag(m_p, old_p, new_p)
            writes.require(tf.reduce_all(new_p > 0))  # an underflow to 0 is as fatal as an overflow
        else:  # every halving retracts from the same P: factor it once
            chol = tf.linalg.cholesky(old_p)
            retract = lambda p, xi, chol=chol: core.retract_full(p, xi, chol)  # noqa: E731
            new_p, _ = core.retract_with_halving(old_p, learning_rate * m_p, retract,
                                                 core.is_positive_definite_full, self.max_halvings)
            # The momentum lives in the tangent space at P: carry it to the new point.
            new_m_p = core.transport_full(m_p, old_p, new_p)
        # An overflowing update (e.g. a huge curvature estimate) must not corrupt q: the guard of
        # BayesianOptimizer.apply writes nothing when any new value is not finite.
        for name, value in (("mean", new_mu), ("precision", new_p), ("m_mean", m_mu), ("m_precision", new_m_p)):
            writes.assign(s[name], value)

    def get_config(self):
        config = super().get_config()
        config.update({"structure": self.structure, "estimator": self.estimator, "curvature": self.curvature,
                       "momentum": self.momentum,
                       "initial_precision": self.initial_precision, "max_halvings": self.max_halvings,
                       "gradient_clip": self.gradient_clip, "max_block_size": self.max_block_size,
                       "mean_learning_rate": _serialize_rate(self.mean_learning_rate)})
        return config


def _serialize_rate(rate):
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return keras.optimizers.schedules.serialize(rate)
    return None if rate is None else float(rate)


def _covariance_cholesky(precision):
    # Sigma = L^-T L^-1 with P = L L^T; its Cholesky factor is chol(inv(P)).
    return tf.linalg.cholesky(tf.linalg.inv(precision))
