"""MGVBP: natural-gradient Gaussian VI on the precision matrix (Magris, Shabani, Iosifidis,
"Manifold Gaussian Variational Bayes on the Precision Matrix", https://arxiv.org/abs/2210.14598).

Estimators (`estimator=`):
  "gradient": reparameterisation / Price-Stein estimator from the per-sample gradients of the
      log joint (nat_mu = Sigma E[g], nat_P = -sym(P E[a g^T]) - P). An extension for networks,
      not in the paper; the only practical one beyond a few hundred weights. Default.
  "score": the paper's default estimator: score function of the log LIKELIHOOD with the Gaussian
      prior (the layers' Normal priors) and the entropy in closed form, with
      per-coordinate control variates from the previous step's samples.
  "score_h": the paper's fully black-box form on h = log p(y, w) - log q(w).
The score-function forms need O(S D^2) memory per step with full P: tens of weights.

Curvature of the "gradient" estimator (`curvature=`), the target that P is moved toward:
  "stein": -E_q[hess] = -P Cov(theta, g) (Stein's lemma), unbiased; exact on conjugate models.
      Noisy and indefinite on networks with few samples: a large negative estimate makes the
      retraction's xi^2 / (2p) term inflate p, and with the paper's step sizes the run diverged on
      LeNet-5. The defaults (a tight initial precision that moves at 1e-3, see "Defaults" below) average
      that noise over ~1,000 steps: MGVBP() trains the zoo's networks with it (the defaults table).
  "empirical_fisher": the diagonal of the per-example empirical Fisher, sum_i (d log p(y_i|w) / dw)^2,
      averaged over the N samples, plus the Normal prior's precision exactly: the curvature of
      VOGN (Khan et al. 2018; Osawa et al. 2019), computed from the layers' inputs and
      pre-activation gradients captured in the same backward pass (bayes_keras.curvature).
      Never negative: the safer choice for deep networks with larger precision steps. structure="diagonal" or "kronecker"; needs
      Normal priors (the default) and Dense / Conv2D particle layers.
  "fisher": as "empirical_fisher" but with labels sampled from the model's own predictive (one
      per example and sample of q): a Monte Carlo estimate of the true Fisher (the generalised
      Gauss-Newton for these likelihoods) diagonal. Costs a second backward pass to the
      pre-activations; unlike the empirical Fisher it does not shrink with the residuals.
"""

import warnings

import keras
import numpy as np
import tensorflow as tf

from bayes_keras._config import check_number
from bayes_keras.core.particle_view import ParticleView
from bayes_keras.curvature.capture import CurvatureRequest
from bayes_keras.loaded_state import check_bounded_entry, check_positive_definite_entry
from bayes_keras.optimizers.gaussian_vi import curvature_targets
from bayes_keras.optimizers.gaussian_vi import natural_gradients as ng
from bayes_keras.optimizers.gaussian_vi.diagonal_gaussian import DiagonalGaussian
from bayes_keras.optimizers.gaussian_vi.full_gaussian import FullGaussian
from bayes_keras.optimizers.gaussian_vi.gaussian_variational_optimizer import (
    GaussianVariationalOptimizer,
)
from bayes_keras.optimizers.gaussian_vi.kronecker_gaussian import KroneckerGaussian
from bayes_keras.schedules import ConstantThenInverseTime

_STRUCTURES = ("full", "layer", "kronecker", "diagonal")
_ESTIMATORS = ("gradient", "score", "score_h")
_CURVATURES = ("stein", "empirical_fisher", "fisher")
_FISHERS = ("empirical_fisher", "fisher")
_SCORE_WEIGHTS = 1000  # above this many weights the score estimators warn


@keras.saving.register_keras_serializable(package="bayes_keras")
class MGVBP(GaussianVariationalOptimizer):
    """Manifold Gaussian Variational Bayes on the Precision matrix (Magris, Shabani & Iosifidis,
    https://arxiv.org/abs/2210.14598): q = N(mu, P^-1) moved by natural gradients (the paper's Eq. 1 with
    the Fisher of q), P retracted on the positive-definite manifold, momentum carried by vector transport
    (its Sec. 3; the update below follows the authors' MATLAB code, mmagris/MGVBP).

    Each step: the model's N particles are samples from q; from their gradients (or log likelihoods)
    the natural gradients of the lower bound are estimated, then

        m <- omega T(m) + (1 - omega) natgrad ;  mu <- mu + beta m_mu ;  P <- P + xi + 1/2 xi P^-1 xi,
        xi = beta m_P  (halved up to `max_halvings` times if round-off broke positive definiteness),

    and N new samples are written into the particle variables.

    Estimators (`estimator=`: "gradient", the default, "score", "score_h") and the curvatures of the
    gradient estimator (`curvature=`: "stein", "empirical_fisher", "fisher") are described in the
    module docstring.

    Args:
        learning_rate: beta, the precision's step size (float or schedule; the paper's schedule is
            `bayes_keras.schedules.ConstantThenInverseTime(beta, tau)`). None (default): 0.1 for the full
            blocks of structure="full" / "layer", whose steps (precision and mean) are further scaled by their
            signal shares unless signal_share=False (see "Defaults"), 1e-3 for "diagonal" / "kronecker"
            (networks).
        mean_learning_rate: step size of mu (float or schedule), default 0.3; None uses `learning_rate`
            for both, as the paper does. An extension for networks, after VOGN's separate mean and
            precision rates: a precision that moves slower than the mean keeps the noise of q small
            while the network is still untrained (docs/architecture.md, "Defaults").
        structure: "full" (one D x D precision), "layer" (one full block per layer), "kronecker" (per
            Dense / Conv2D layer P = A (x) G over its [kernel; bias] matrix, KFAC's factors from
            bayes_keras.curvature: the mean steps by P^-1 E[g] through the factors, each factor is
            retracted toward the batch's factors damped by the prior precision / T (the nearest
            Kronecker product of A (x) G + D (x) I, natural_gradients.damped_kronecker_factors), no
            momentum on the factors; needs curvature "empirical_fisher" or "fisher"; an extension in
            the spirit of Noisy K-FAC, not in the paper) or "diagonal".
        estimator: "gradient" | "score" | "score_h" (see above).
        curvature: "stein" | "empirical_fisher" | "fisher", for estimator="gradient" (see above).
        momentum: omega in m <- omega T(m) + (1 - omega) natgrad (default 0.8; paper: 0.4). The first
            step sets m to the natural gradient.
        initial_precision: P at the start, times the identity (default 1e3; paper: 1 / s0 = 10). mu starts at
            the first particle's initial weights (or at `model.initialize_particles` values).
        max_halvings: retraction step halvings tried before a step of P is dropped.
        gradient_clip: if set, the stacked natural gradient (mu, P) of each block is scaled to at
            most this norm (the paper's GradientMax = 100); not for structure="kronecker". "auto"
            (default): 100 for the score estimators (without it MGVBP(estimator="score") took a
            digits MLP's training loss to 8e6 in its first epoch), None for "gradient".
        initial_gradient_clip: the bound for the first step's estimate (the paper's separate clip0, whose
            default in the authors' code is off): "same" (default) as `gradient_clip`, None (no clipping at
            the first step) or a positive number.
        max_block_size: a full block larger than this raises an error (O(D^3) per step).
        seed: seed of the sample stream (draws are keyed by (seed, counter), so a resumed run
            samples what an uninterrupted one would).
        signal_share: True (default): the full blocks (structure "full" / "layer") scale their mean and
            precision steps by their signal shares (see "Defaults"; an extension, not in the paper). False:
            they step by beta m alone, as the paper does. Diagonal and Kronecker blocks never rescale.

    Other Parameters:
        antithetic: draw the samples of q in mirrored pairs mu +- a (even sample counts; odd counts
            draw independently): half the random numbers, which dominated the cost of a step on
            CPU, and exact cancellation of the mean gradient's odd part; but a second moment of the
            draws (the Stein and score curvatures) then sees only S / 2 independent draws. None
            (default): True for the Fisher curvatures, False for "stein" and the score estimators.

    Defaults: chosen so that MGVBP() trains the zoo's MLP, LeNet-5 and GRU and a logistic regression
    without tuning (benchmarks/defaults.py): for networks (structure "diagonal" / "kronecker") a precision
    that starts tight (sd 0.03) and moves slowly (1e-3, a running average of the curvature over ~1,000
    steps, as VOGN's) while the mean takes natural-gradient steps of 0.3 with momentum 0.8. Full blocks
    (structure "full" / "layer", at most `max_block_size` weights each: small models, often fitted full
    batch) step their precision at 0.1 times its signal share, and their mean at 0.3 times its own
    (`bayes_keras.step_rules.signal_fraction`, i.e. bayes_keras.core.step_rules: the share of the
    momentum-averaged natural gradient that persists from step to step), so P leaves its
    tight start within a few hundred steps and then averages the Monte Carlo noise of its curvature: on the
    breast_cancer logistic regression (full batch, 100 samples, 3,000 steps) MGVBP(structure="full")
    reaches the exact optimal Gaussian's sds (0.96-1.00 of NUTS'), where the network defaults left them at
    0.15-0.31 (tests/test_defaults_nuts.py). The same scaled step on diagonal precisions sent LeNet-5 to
    chance accuracy: per weight, the curvature of a 10-sample minibatch step is mostly noise, and a
    precision that follows it within tens of steps lets q's noise swamp a mean that is still untrained.
    The paper's own iteration (its estimator B, one step size beta for mu and P with its schedule, omega =
    0.4, P0 = 10 I, gradient clipping at 100, no signal-share scaling) is `MGVBP.paper()`, i.e.
    MGVBP(ConstantThenInverseTime(1e-3, 2500), structure="full", estimator="score", momentum=0.4,
    initial_precision=10.0, mean_learning_rate=None, gradient_clip=100.0, initial_gradient_clip=None,
    signal_share=False); tested step by step against a NumPy transcription of the algorithm
    (tests/test_mgvbp_paper_mode.py).

    Example:
        >>> model.compile(optimizer=bayes_keras.optimizers.MGVBP(1e-2, structure="diagonal"))
        >>> q = model.optimizer.posterior()   # tfd distribution over the flattened weights
    """

    def __init__(
        self,
        learning_rate=None,
        structure="diagonal",
        estimator="gradient",
        curvature="stein",
        momentum=0.8,
        initial_precision=1e3,
        max_halvings=5,
        gradient_clip="auto",
        max_block_size=2000,
        seed=None,
        mean_learning_rate=0.3,
        signal_share=True,
        initial_gradient_clip="same",
        **kwargs,
    ):
        if isinstance(gradient_clip, str) and gradient_clip == "auto":
            gradient_clip = 100.0 if estimator in ("score", "score_h") else None
        _check_arguments(
            structure, estimator, curvature, gradient_clip, momentum, initial_precision
        )
        if not (isinstance(initial_gradient_clip, str) and initial_gradient_clip == "same"):
            initial_gradient_clip = check_number(
                initial_gradient_clip,
                "MGVBP initial_gradient_clip ('same', None or a number)",
                allow_none=True,
            )
            if structure == "kronecker" and initial_gradient_clip is not None:
                raise ValueError(
                    "MGVBP initial_gradient_clip is not implemented for structure='kronecker'; got "
                    f"initial_gradient_clip={initial_gradient_clip!r}."
                )
        if not isinstance(signal_share, bool):
            raise ValueError(f"MGVBP signal_share must be True or False; got {signal_share!r}.")
        if learning_rate is None:
            learning_rate = 0.1 if structure in ("full", "layer") else 1e-3
        super().__init__(learning_rate=learning_rate, seed=seed, **kwargs)
        self.structure, self.estimator, self.curvature = structure, estimator, curvature
        self.momentum = float(momentum)
        self.initial_precision = check_number(initial_precision, "MGVBP initial_precision")
        self.max_halvings = _count(max_halvings, "max_halvings", minimum=0)
        self.gradient_clip = check_number(gradient_clip, "MGVBP gradient_clip", allow_none=True)
        self.max_block_size = _count(max_block_size, "max_block_size", minimum=1)
        if isinstance(mean_learning_rate, dict):
            mean_learning_rate = keras.optimizers.schedules.deserialize(mean_learning_rate)
        if not isinstance(mean_learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            mean_learning_rate = check_number(
                mean_learning_rate,
                "MGVBP mean_learning_rate (None: learning_rate)",
                allow_none=True,
            )
        self.mean_learning_rate = mean_learning_rate
        self.signal_share, self.initial_gradient_clip = signal_share, initial_gradient_clip

    @classmethod
    def paper(cls, learning_rate=1e-3, tau=2500, structure="full", estimator="score", **kwargs):
        """MGVBP running the paper's own iteration (Magris, Shabani & Iosifidis, "Manifold Gaussian Variational
        Bayes on the Precision Matrix", https://arxiv.org/abs/2210.14598, as the authors' code runs it), with its
        defaults: per step, from S samples theta_s = mu + L^-T eps_s of q (P = L L^T; S = the model's
        particles),

            g_mu = -Sigma Sigma0^-1 (mu - mu0) + mean_s a_s (log p(y | theta_s) - c_mu),
            g_P  = (Sigma0^-1 - P) + mean_s (P - P a_s a_s^T P)(log p(y | theta_s) - c_P),   a_s = theta_s - mu,

        (its estimator B: the Gaussian prior N(mu0, Sigma0) of the layers in closed form; c the per-coordinate
        control variates Cov(s f, s) / Var(s) of the previous step's samples, s = a or P - P a a^T P and f the
        log likelihood, 0 at the first step), the stacked (g_mu, g_P) scaled to norm at most 100 from the
        second step on (the first step unclipped, as the authors' code by default), then

            m_mu <- omega m_mu + (1 - omega) g_mu ;  m_P <- omega T(m_P) + (1 - omega) g_P   (m = g at t = 1)
            mu <- mu + beta_t m_mu ;  P <- P + beta_t m_P + 1/2 beta_t^2 m_P P^-1 m_P,

        T the vector transport E m E^T, E = (P_new P_old^-1)^(1/2), beta_t = beta for t <= tau and beta tau / t
        after; omega = 0.4, P0 = 10 I. No signal-share scaling, one step size for mu and P. (The authors' code
        draws randomised quasi-Monte Carlo normals; here they are pseudo-random, keyed by `seed`.) The paper
        uses S = 50 samples: build the model with num_particles=50. Its experiments change some of these
        settings (e.g. the labour-force logistic regression: beta = 0.01, P0 = 20 I, clip 3000, first clip
        1000), which the keyword arguments override.

        Args:
            learning_rate: beta (default 1e-3, the paper's); a number, or a schedule when tau is None.
            tau: steps of constant beta before the 1 / t decay (default 2500, the paper's t_max / 2 for its
                5,000 iterations); None: `learning_rate` as given (a constant or a schedule).
            structure: "full" (the paper's main case, default), "layer" or "diagonal" (the paper's diagonal
                case: p <- p + beta xi + beta^2 xi^2 / (2 p), transport m p_new / p_old).
            estimator: "score" (estimator B, default) or "score_h" (the fully black-box h-function form).
            **kwargs: other MGVBP arguments (seed, max_block_size, ...), or overrides of the settings above.

        Example:
            >>> model.compile(optimizer=bayes_keras.optimizers.MGVBP.paper(seed=0))   # e.g. 50 particles
        """
        if estimator not in ("score", "score_h"):
            raise ValueError(
                f"MGVBP.paper: the paper's estimators are 'score' and 'score_h'; got "
                f"estimator={estimator!r}."
            )
        if structure not in ("full", "layer", "diagonal"):
            raise ValueError(
                f"MGVBP.paper: structure must be 'full', 'layer' or 'diagonal'; got "
                f"structure={structure!r}."
            )
        if tau is not None:
            if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
                raise ValueError(
                    f"MGVBP.paper: learning_rate is already a schedule ({learning_rate!r}); pass "
                    f"tau=None to use it, or a number for beta; got tau={tau!r}."
                )
            learning_rate = ConstantThenInverseTime(learning_rate, tau)
        settings = {
            "momentum": 0.4,
            "initial_precision": 10.0,
            "mean_learning_rate": None,
            "gradient_clip": 100.0,
            "initial_gradient_clip": None,
            "signal_share": False,
        }
        settings.update(kwargs)
        return cls(learning_rate, structure=structure, estimator=estimator, **settings)

    @property
    def _diagonal_posterior(self):
        return self.structure == "diagonal"

    @property
    def _antithetic_by_default(self):
        # Stein and score curvatures are second moments of the draws: mirrored pairs would halve
        # their effective sample size (measured: 2x the precision error on a conjugate model).
        return self.curvature in _FISHERS

    @property
    def _elementwise(self):
        return self.structure == "diagonal" and self.estimator == "gradient"

    # -- blocks: one Gaussian family object each -----------------------------------------------
    def _block_groups(self, view):
        # full: one block; layer / kronecker: one per layer; diagonal: one flat block (elementwise anyway)
        return view.partition("layer" if self.structure in ("layer", "kronecker") else "joint")

    def build(self, variables):
        if self.built:
            return
        view = ParticleView(variables)  # the checks run before any variable is created
        if self.estimator != "gradient" and sum(view.sizes) > _SCORE_WEIGHTS:
            warnings.warn(
                f"MGVBP estimator={self.estimator!r} on {sum(view.sizes)} weights: the score-function estimator's "
                "variance grows with the number of weights, and on a digits MLP of 1,500 weights it does not "
                "learn (test NLL 2.35, chance, after 3 epochs). It is the paper's estimator for small models; "
                "use estimator='gradient' (the default) for networks.",
                UserWarning,
                stacklevel=2,
            )
        blocks = self._block_groups(view)
        if self.structure == "kronecker":
            self._kron_shapes = curvature_targets.kronecker_shapes(
                view, blocks, self.max_block_size
            )
            self._kron_index = {
                g[0]: j for j, g in enumerate(blocks)
            }  # the view index of each layer's kernel
        elif self.structure != "diagonal":
            _check_block_sizes(view, blocks, self.structure, self.max_block_size)
        super().build(variables)

    def _family(self, j, dim):
        if self.structure == "kronecker":
            return KroneckerGaussian(
                *self._kron_shapes[j],
                self.posterior_dtype,
                self.initial_precision,
                self.max_halvings,
            )
        control_variates = self.estimator != "gradient"
        if self.structure == "diagonal":
            return DiagonalGaussian(
                dim, self.posterior_dtype, self.initial_precision, control_variates
            )
        return FullGaussian(
            dim,
            self.posterior_dtype,
            self.initial_precision,
            control_variates,
            self.max_halvings,
            self.signal_share,
        )

    def check_loaded_state(self):
        for block in self._state:
            for name in ("precision", "factor_a", "factor_g"):
                if name not in block:
                    continue
                if self.structure == "diagonal":
                    check_bounded_entry(
                        self.name, block[name], "optimizer", "a diagonal precision", positive=True
                    )
                else:
                    check_positive_definite_entry(
                        self.name,
                        block[name],
                        "optimizer",
                        "a precision" if name == "precision" else "a Kronecker factor",
                    )

    def check_num_particles(self, num_particles):
        super().check_num_particles(num_particles)
        if num_particles < 2 and self.curvature not in _FISHERS:
            what = (
                "the Stein curvature (a sample covariance)"
                if self.estimator == "gradient"
                else "control variates"
            )
            raise ValueError(
                f"MGVBP estimator={self.estimator!r} needs at least 2 samples of q per step for "
                f"{what}; got num_particles={num_particles}. Use more particles, or "
                "curvature='empirical_fisher'."
            )

    @property
    def curvature_request(self):
        """What BayesianModel must capture for this optimizer (None: nothing)."""
        if self.curvature not in _FISHERS:
            return None
        return CurvatureRequest(
            "kronecker_factors" if self.structure == "kronecker" else "squared_gradients",
            "sampled" if self.curvature == "fisher" else "observed",
        )

    # -- the update ----------------------------------------------------------------------------
    def _step_sizes(self, learning_rate, iteration):
        """(beta for P, beta for mu, omega): the first step sets the momentum to the natural gradient."""
        mean_lr = self.mean_learning_rate
        if mean_lr is None:
            mean_lr = learning_rate
        else:
            if isinstance(mean_lr, keras.optimizers.schedules.LearningRateSchedule):
                mean_lr = mean_lr(self.attempted_steps)  # as the learning rate's schedule
            mean_lr = tf.cast(mean_lr, self.posterior_dtype)
        omega = tf.where(
            tf.equal(iteration, 1.0),
            tf.constant(0.0, self.posterior_dtype),
            tf.constant(self.momentum, self.posterior_dtype),
        )
        return learning_rate, mean_lr, omega

    def _step(self, j, nat_mu, nat_p, sizes, iteration, writes):
        later = self.gradient_clip
        first = later if isinstance(self.initial_gradient_clip, str) else self.initial_gradient_clip
        if first == later:
            if later is not None:
                nat_mu, nat_p = ng.clip_by_norm(nat_mu, nat_p, later)
        else:  # another bound (or none: an infinite one) at the first step
            bounds = [float("inf") if bound is None else bound for bound in (first, later)]
            bound = tf.where(
                tf.equal(iteration, 1.0), *(tf.constant(b, nat_mu.dtype) for b in bounds)
            )
            nat_mu, nat_p = ng.clip_by_norm(nat_mu, nat_p, bound)
        self._families[j].step(self._state[j], nat_mu, nat_p, *sizes, writes)

    def _update_elementwise(self, thetas, loss_grads, learning_rate, iteration, step, writes):
        """Diagonal structure with the gradient estimator, per particle variable on slices of the flat
        state. loss_grads are gradients of -log p(y, theta): E[g_logjoint] = -E[g], and
        nat_P = -p Cov(a, g_logjoint) - p = p Cov(a, g) - p."""
        n = self.view.num_particles
        mean, prec = self._state[0]["mean"].value, self._state[0]["precision"].value
        if self.curvature in _FISHERS:
            mean_loss_grad = tf.concat([tf.reduce_sum(g, axis=0) for g in loss_grads], 0) / float(n)
            block = self._blocks[0]
            nat_p = (
                curvature_targets.fisher_diagonal(
                    self.view, block, self._records(step), self.curvature, self.posterior_dtype
                )
                + curvature_targets.tempered_prior_precision(
                    self.view, block, step, self.curvature, self.posterior_dtype
                )
                - prec
            )
        else:  # per-variable sums, then the moments once on the concatenated (D,) sums
            sums = [], [], []
            for m, theta, g in zip(tf.split(mean, self.view.sizes), thetas, loss_grads):
                a = theta - m
                for out, t in zip(sums, (a, g, a * g)):
                    out.append(tf.reduce_sum(t, axis=0))
            mean_loss_grad, cov = ng.diagonal_moments_from_sums(
                *(tf.concat(t, 0) for t in sums), n, self._antithetic_for(n)
            )
            nat_p = prec * cov - prec
        self._step(
            0,
            -mean_loss_grad / prec,
            nat_p,
            self._step_sizes(learning_rate, iteration),
            iteration,
            writes,
        )

    def _update_blocks(self, thetas, grads, learning_rate, iteration, step, writes):
        sizes = self._step_sizes(learning_rate, iteration)
        if self.structure == "kronecker":
            targets = curvature_targets.kronecker_targets(
                self.view,
                self._blocks,
                self._kron_index,
                self._records(step),
                self.curvature,
                step.temperature,
                self.posterior_dtype,
            )
            for j, (grad, target) in enumerate(zip(grads, targets)):
                self._families[j].step(
                    self._state[j], tf.reduce_mean(grad, axis=0), target, *sizes, writes
                )
            return
        for j, (theta, grad) in enumerate(zip(thetas, grads)):
            self._step(
                j, *self._natural_gradient(j, theta, grad, step, writes), sizes, iteration, writes
            )

    def _natural_gradient(self, j, theta, grad, step, writes):
        """(nat_mu, nat_P) of a diagonal or full block from the step's samples and gradients (or values)."""
        state = self._state[j]
        mean, prec = state["mean"].value, state["precision"].value
        diag = self.structure == "diagonal"
        if self.estimator == "gradient":  # full or layer blocks (diagonal: _update_elementwise)
            return ng.reparam_natural_gradient_full(
                theta, mean, prec, grad, antithetic=self._antithetic_for(self.view.num_particles)
            )
        if step is None:
            raise ValueError(
                f"MGVBP estimator='{self.estimator}' needs the per-sample log likelihoods: train "
                "through BayesianModel.fit, or pass the step of model.bayesian_gradients to apply()."
            )
        log_lik = tf.cast(step.log_likelihood, self.posterior_dtype)
        fn = ng.score_natural_gradient_diag if diag else ng.score_natural_gradient_full
        c_mu, c_p = state["c_mean"].value, state["c_precision"].value
        if self.estimator == "score":
            prior_mean, prior_prec = curvature_targets.prior_vectors(
                self.view, self._blocks[j], self.posterior_dtype, "estimator='score'"
            )
            nat_mu, nat_p, new_c_mu, new_c_p = fn(
                theta, mean, prec, log_lik, c_mu, c_p, prior_mean, prior_prec / step.temperature
            )
        else:
            log_q = ng.log_q_diag(theta, mean, prec) if diag else ng.log_q_full(theta, mean, prec)
            h = log_lik + tf.cast(step.log_prior, self.posterior_dtype) - log_q
            nat_mu, nat_p, new_c_mu, new_c_p = fn(theta, mean, prec, h, c_mu, c_p)
        writes.assign(state["c_mean"], new_c_mu)
        writes.assign(state["c_precision"], new_c_p)
        return nat_mu, nat_p

    # -- curvature="empirical_fisher" | "fisher" -------------------------------------------------
    def _records(self, step):
        if step is None or not step.curvature:
            raise ValueError(
                f"MGVBP curvature={self.curvature!r} needs the layers' captured curvature: train "
                "through BayesianModel.fit, or pass the step of model.bayesian_gradients to apply()."
            )
        return step.curvature

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "structure": self.structure,
                "estimator": self.estimator,
                "curvature": self.curvature,
                "momentum": self.momentum,
                "initial_precision": self.initial_precision,
                "max_halvings": self.max_halvings,
                "gradient_clip": self.gradient_clip,
                "max_block_size": self.max_block_size,
                "mean_learning_rate": _serialize_rate(self.mean_learning_rate),
                "signal_share": self.signal_share,
                "initial_gradient_clip": self.initial_gradient_clip,
            }
        )
        return config


def _check_arguments(structure, estimator, curvature, gradient_clip, momentum, initial_precision):
    if structure not in _STRUCTURES:
        raise ValueError(f"MGVBP structure must be one of {_STRUCTURES}; got {structure!r}.")
    if estimator not in _ESTIMATORS:
        raise ValueError(f"MGVBP estimator must be one of {_ESTIMATORS}; got {estimator!r}.")
    if curvature not in _CURVATURES:
        raise ValueError(f"MGVBP curvature must be one of {_CURVATURES}; got {curvature!r}.")
    if curvature in _FISHERS and structure not in ("diagonal", "kronecker"):
        raise ValueError(
            f"MGVBP curvature={curvature!r} is implemented for structure='diagonal' and "
            f"'kronecker'; got structure={structure!r}."
        )
    if structure == "kronecker" and curvature not in _FISHERS:
        raise ValueError(
            "MGVBP structure='kronecker' moves P toward KFAC factors: it needs "
            f"curvature='empirical_fisher' or 'fisher'; got curvature={curvature!r}."
        )
    if curvature != "stein" and estimator != "gradient":
        raise ValueError(
            f"MGVBP curvature={curvature!r} belongs to estimator='gradient'; the score "
            f"estimators estimate the curvature themselves (got estimator={estimator!r})."
        )
    if structure == "kronecker" and gradient_clip is not None:
        raise ValueError(
            "MGVBP gradient_clip is not implemented for structure='kronecker'; got "
            f"gradient_clip={gradient_clip!r}."
        )
    if not (
        isinstance(momentum, (int, float))
        and not isinstance(momentum, bool)
        and 0.0 <= momentum < 1.0
    ):
        raise ValueError(f"MGVBP momentum (omega) must be in [0, 1); got {momentum!r}.")
    check_number(initial_precision, "MGVBP initial_precision")


def _count(value, what, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"MGVBP {what} must be an integer >= {minimum}; got {value!r}.")
    return int(value)


def _check_block_sizes(view, blocks, structure, max_block_size):
    for g in blocks:
        dim = sum(view.sizes[i] for i in g)
        if dim > max_block_size:
            names = ", ".join(view.variables[i].path for i in g)
            raise ValueError(
                f"MGVBP structure='{structure}' needs a {dim} x {dim} precision block for [{names}], above "
                f"max_block_size={max_block_size} (O(D^3) per step). Use "
                + ("structure='layer' (one block per layer), " if structure == "full" else "")
                + "structure='kronecker' (Dense and Conv2D layers) or structure='diagonal' for a model this large, "
                "or raise max_block_size."
            )


def _serialize_rate(rate):
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return keras.optimizers.schedules.serialize(rate)
    return None if rate is None else float(rate)
