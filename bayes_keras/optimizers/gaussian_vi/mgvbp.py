"""MGVBP: natural-gradient Gaussian VI on the precision matrix (Magris, Shabani & Iosifidis, "Manifold
Gaussian Variational Bayes on the Precision Matrix", https://arxiv.org/abs/2210.14598).

`MGVBP(structure=...)` is the one class users construct; it builds the class of its structure, each in its
own file with its posterior family and its estimators:

- structure="diagonal" (networks, the default): `mgvbp_diagonal.MGVBPDiagonal`
- structure="full" / "layer" (small models: one D x D precision, or one per layer): `mgvbp_full.MGVBPFull`
- structure="kronecker" (per Dense / Conv layer P = A (x) G): `mgvbp_kronecker.MGVBPKronecker`

This file holds what they share at construction: the arguments, the paper's settings (`MGVBP.paper`) and
the curvature request; what they share in their update (the step sizes, the clipping of the natural
gradient, the score estimators' bookkeeping, the priors' closed forms) is in mgvbp_update.py. The sampling and the lower bound are the base's
(gaussian_variational_optimizer.py). Every step, from the model's N particles (samples of q):

    m <- omega T(m) + (1 - omega) natgrad          (momentum, carried by the vector transport T)
    mu <- mu + beta_mu m_mu ;  P <- P + xi + 1/2 xi P^-1 xi,  xi = beta m_P     (the paper's Eq. 1 and its
                                                                                 retraction, Sec. 3)

and N new samples of q are written into the particle variables. Which natural gradient (`estimator`,
`curvature`) and which P (`structure`) is the structure file's docstring; the user guide's
"MGVBP's options" explains the choices and the defaults.
"""

import warnings

import keras
import numpy as np

from bayes_keras._config import check_number
from bayes_keras.core.particle_view import ParticleView
from bayes_keras.curvature.records import CurvatureRequest
from bayes_keras.optimizers.gaussian_vi.gaussian_variational_optimizer import (
    GaussianVariationalOptimizer,
)
from bayes_keras.schedules import ConstantThenInverseTime

_STRUCTURES = ("full", "layer", "kronecker", "diagonal")
_ESTIMATORS = ("gradient", "score", "score_h")
_CURVATURES = ("stein", "empirical_fisher", "fisher")
FISHERS = ("empirical_fisher", "fisher")
_SCORE_WEIGHTS = 1000  # above this many weights the score estimators warn


@keras.saving.register_keras_serializable(package="bayes_keras")
class MGVBP(GaussianVariationalOptimizer):
    """Manifold Gaussian Variational Bayes on the Precision matrix (Magris, Shabani & Iosifidis,
    https://arxiv.org/abs/2210.14598): q = N(mu, P^-1) moved by natural gradients, P retracted on the
    positive-definite manifold, momentum carried by vector transport; the model's particles are samples of q.

        m <- omega T(m) + (1 - omega) natgrad ;  mu <- mu + beta_mu m_mu ;  P <- P + xi + 1/2 xi P^-1 xi,
        xi = beta m_P  (halved up to `max_halvings` times if round-off broke positive definiteness).

    Args:
        learning_rate: beta, the precision's step size (float or schedule). None (default): 0.1 for
            structure "full" / "layer", 1e-3 for "diagonal" / "kronecker".
        structure: "diagonal" (default), "full" (one D x D precision), "layer" (one full block per layer) or
            "kronecker" (per Dense / Conv layer P = A (x) G; needs a Fisher curvature).
        estimator: "gradient" (default: the reparameterisation / Price-Stein estimator, an extension for
            networks), "score" (the paper's estimator B) or "score_h" (its black-box form).
        curvature: the target P moves toward under estimator="gradient": "stein" (default, -E_q[hess] by
            Stein's lemma), "empirical_fisher" or "fisher" (diagonal / kronecker: the layers' captured
            Fisher plus the prior precision).
        momentum: omega (default 0.8; the paper: 0.4). The first step sets m to the natural gradient.
        initial_precision: P at the start, times the identity (default 1e3; the paper: 10). mu starts at
            the first particle's initial weights.
        max_halvings: retraction step halvings tried before a step of P is dropped.
        gradient_clip: scale each block's stacked natural gradient (mu, P) to at most this norm (the paper's
            GradientMax); "auto" (default): 100 for the score estimators, None for "gradient".
        initial_gradient_clip: the first step's bound: "same" (default), None or a number.
        max_block_size: a full block or Kronecker factor larger than this raises an error (O(D^3) per step).
        seed: seed of the sample stream (keyed by (seed, counter): a resumed run draws what an
            uninterrupted one would).
        mean_learning_rate: beta_mu, the mean's step size (default 0.3); None: `learning_rate`, as the paper.
        signal_share: full blocks scale both steps by their signal shares (default True, an extension);
            False steps by beta m alone, as the paper.

    Other Parameters:
        antithetic: draw q's samples in mirrored pairs mu +- a. None (default): True for the Fisher
            curvatures, False for the second-moment ones ("stein", the score estimators).

    `MGVBP.paper()` runs the paper's own iteration and settings. The user guide's "MGVBP's options"
    compares the estimators, curvatures and structures and explains the defaults.

    Example:
        >>> model.compile(optimizer=bayes_keras.optimizers.MGVBP(1e-2, structure="diagonal"))
        >>> q = model.optimizer.posterior()   # tfd distribution over the flattened weights
    """

    _classes = {}  # structure -> the class that implements it (filled by the subclasses)
    structures = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for structure in cls.structures:
            MGVBP._classes[structure] = cls

    @property
    def method_name(self):
        return "MGVBP"

    def __new__(cls, learning_rate=None, structure="diagonal", *args, **kwargs):
        if cls is MGVBP:
            if structure not in _STRUCTURES:
                raise ValueError(
                    f"MGVBP structure must be one of {_STRUCTURES}; got {structure!r}."
                )
            cls = MGVBP._classes[structure]
        return super().__new__(cls)

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
        if structure not in type(self).structures:
            raise ValueError(
                f"{type(self).__name__} implements structure {type(self).structures}; got "
                f"structure={structure!r}. Construct MGVBP(structure=...)."
            )
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
        # What BayesianModel must capture for this optimizer (None: nothing)
        self.curvature_request = (
            CurvatureRequest(
                "kronecker_factors" if structure == "kronecker" else "squared_gradients",
                "sampled" if curvature == "fisher" else "observed",
            )
            if curvature in FISHERS
            else None
        )
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
        # Stein and score curvatures are second moments of the draws: mirrored pairs would halve their
        # effective sample size, so they draw independently unless `antithetic` says otherwise.
        self._antithetic_by_default = curvature in FISHERS

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
                case: p <- p + beta m_p + beta^2 m_p^2 / (2 p), transport m_p p_new / p_old).
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
        self.check_structure(view)
        super().build(variables)

    def check_structure(self, view):
        """Raise a ValueError, before any variable is built, when the structure cannot hold this model."""

    def check_num_particles(self, num_particles):
        super().check_num_particles(num_particles)
        if num_particles < 2 and self.curvature not in FISHERS:
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
    if structure == "kronecker" and estimator != "gradient":
        raise ValueError(
            "MGVBP structure='kronecker' needs estimator='gradient' (with curvature='empirical_fisher' or "
            f"'fisher'); got estimator={estimator!r}."
        )
    if curvature in FISHERS and structure not in ("diagonal", "kronecker"):
        raise ValueError(
            f"MGVBP curvature={curvature!r} is implemented for structure='diagonal' and "
            f"'kronecker'; got structure={structure!r}."
        )
    if structure == "kronecker" and curvature not in FISHERS:
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


def _serialize_rate(rate):
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return keras.optimizers.schedules.serialize(rate)
    return None if rate is None else float(rate)
