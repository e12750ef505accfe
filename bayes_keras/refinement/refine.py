"""Local refinement of a diagonal Gaussian posterior with auxiliary variables (Havasi et al. 2021).

"Sampling the Variational Posterior with Local Refinement", Entropy 23(11), 1475, 2021,
https://doi.org/10.3390/e23111475. Each of M refined samples is drawn by K stages: sample an auxiliary
variable a_k in closed form from the current q (App. A), condition q on it in closed form (the warm
start), and, for k < K, fit q briefly to the conditional lower bound; the sample is then drawn from the
last q. The M samples run side by side, one per particle slot: each step costs one step of the base
method, so the paper's O(M K) sequential stages take K - 1 stage lengths here.
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from bayes_keras.training import call_checks
from bayes_keras.model import BayesianModel
from bayes_keras.refinement import auxiliary
from bayes_keras.refinement.conditional_gaussians import ConditionalGaussians
from bayes_keras.refinement.density_target import DensityTarget
from bayes_keras.refinement.model_target import ModelTarget


@dataclasses.dataclass
class RefinementHistory:
    """What a refinement did.

    Attributes:
        elbo_aux: (K + 1, M) lower bounds: row 0 the base ELBO (the same q for every sample), row k the
            auxiliary bound of Eq. 13 after stage k (ELBO_aux of sample m: the expected log likelihood
            under its q_k, minus the log density ratios log q_{j-1}(a_j) / p(a_j) of the auxiliary
            variables drawn so far, minus KL(q_k || p(w | a_1..a_k))). In the units of the model's "elbo"
            metric (per training example) for `refine`, in nats for `refine_log_prob`.
        stage_learning_rates: the Adam step size of each optimised stage.
        refinement_steps: optimisation steps taken (all M samples advance together in one step).
        base_steps: steps of the base training (the optimizer's iterations; None for `refine_log_prob`).
        seconds: wall time.
    """

    elbo_aux: np.ndarray
    stage_learning_rates: list
    refinement_steps: int
    base_steps: int = None
    seconds: float = 0.0

    @property
    def base_elbo(self):
        return float(self.elbo_aux[0, 0])

    @property
    def history(self):
        """{"elbo_aux": mean over the samples after each stage (stage 0: the base ELBO)}, like keras' History."""
        return {"elbo_aux": [float(v) for v in self.elbo_aux.mean(axis=1)]}

    def cost_summary(self):
        """Refinement steps as a fraction of the base training's steps."""
        if not self.base_steps:
            return f"{self.refinement_steps} refinement steps"
        return (
            f"{self.refinement_steps} refinement steps for {self.elbo_aux.shape[1]} samples, "
            f"{self.refinement_steps / self.base_steps:.2f} x the {self.base_steps} steps of base training"
        )


def refine(
    model,
    x=None,
    y=None,
    num_samples=None,
    num_stages=5,
    variance_ratio=0.7,
    variances=None,
    steps_per_stage=None,
    learning_rate=1e-3,
    batch_size=32,
    sample_weight=None,
    seed=None,
    verbose="auto",
):
    """Replace a model's particles by M samples of its locally refined Gaussian posterior.

    The model must have been trained with a diagonal Gaussian posterior (`MGVBP(structure="diagonal")`,
    `MeanFieldVI`) and Normal priors. Its optimizer keeps the base posterior untouched; the refined
    samples go into the particle variables, so predict, predictive, metrics and export use them. The
    priors are the layers' own; the posterior temperature T is honoured (the tempered prior N(loc, T s^2)
    is the one split into auxiliary variables).

    Further arguments:

    - x, y: training data as for fit (arrays, or a tf.data.Dataset of (x, y) batches with y=None).

    Args:
        model: a compiled, trained `bayes_keras.BayesianModel`.
        num_samples: M, the model's number of particles (the default; another value raises).
        num_stages: K auxiliary variables (K = 1 samples the base posterior).
        variance_ratio: each a_k takes this fraction of the prior variance still left (paper: 0.7).
        variances: an explicit schedule instead (fractions of the prior variance, summing to < 1).
        steps_per_stage: Adam steps of each optimised stage (the paper: 200), or None (default): each stage
            runs until its objective stops improving (`stage_converged`: checked every 200 steps, a plateau
            when the mean per-step estimate of the last 200 steps is no more than 2 standard errors above
            that of the 200 before), then at a tenth of the rate until that plateaus too (the iterates'
            jitter shrinks with the rate), at most `MAX_STEPS_PER_STAGE` (5,000) steps. A fixed 200 stops the
            stages before they converge: on a correlated 20-dimensional Gaussian posterior (tests/
            test_refinement.py) 1,000 refined samples have a covariance error (relative Frobenius) of 0.82
            after 200 steps per stage at 1e-2 (the earlier defaults), from the mean-field base's 0.94, and
            0.42 with the defaults.
        learning_rate: stage k uses learning_rate * s_k / s_0, proportional to the conditional prior's
            standard deviation (the paper: 1e-3 * 0.3^(k/2)).
        batch_size: minibatch size for arrays.
        sample_weight: per-example weights for arrays, as in fit.
        seed: seed of the auxiliary draws and of the stages' samples.
        verbose: "auto" / 1 shows a progress bar over the stages, 0 nothing.

    Returns:
        A `RefinementHistory`.

    Example:
        >>> model.compile(optimizer=bayes_keras.optimizers.MGVBP(structure="diagonal",
        ...                                                      curvature="empirical_fisher"))
        >>> model.fit(x, y, epochs=30)
        >>> history = bayes_keras.refinement.refine(model, x, y, num_stages=5)
        >>> history.history["elbo_aux"]                      # base ELBO, then one bound per stage
        >>> probs = model.predict(x_test)                    # now from the refined samples
    """
    if not (
        verbose == "auto" or (isinstance(verbose, (int, np.integer, bool)) and verbose in (0, 1, 2))
    ):
        raise ValueError(f"refine: verbose must be 'auto', 0, 1 or 2; got {verbose!r}.")
    call_checks.batch_size(batch_size)
    call_checks.sample_weight(sample_weight)
    if isinstance(model, BayesianModel) and x is not None:
        call_checks.inputs(model, x, "refine")
        call_checks.target_values(model, y, "refine")
    if (
        call_checks.in_memory(x)
        and call_checks.in_memory(y)
        and hasattr(x, "shape")
        and hasattr(y, "shape")
        and len(x) != len(y)
    ):
        raise ValueError(
            f"refine: y has {len(y)} rows and x {len(x)}; give one target per example."
        )
    target = ModelTarget(model, x, y, batch_size, sample_weight, seed)
    m = target.num_particles
    if num_samples is not None and num_samples != m:
        _check_positive_int(num_samples, "num_samples")
        raise ValueError(
            f"refine writes one refined sample per particle slot: num_samples must equal the model's "
            f"{m} particles; got {num_samples}. Build the model with num_particles={num_samples}."
        )
    nu, var = target.base_posterior()
    original = target.particle_values()
    finished = False
    try:
        history = _refine(
            target,
            np.broadcast_to(nu, (m,) + nu.shape),
            np.broadcast_to(var, (m,) + var.shape),
            m,
            num_stages,
            variance_ratio,
            variances,
            steps_per_stage,
            learning_rate,
            seed,
            verbose,
            target.dataset_size,
        )
        finished = True
    finally:
        # interrupted: the particles go back to what they were (the base posterior is untouched)
        if not finished:
            target.assign_particles(original)
    if not all(np.all(np.isfinite(v)) for v in target.particle_values()):
        target.assign_particles(original)  # non-finite samples are never written, as for any update
        raise ValueError(
            "refine: the refined samples are not finite (NaN or Inf in x or y, or too large a "
            "learning_rate); the particles were left as they were."
        )
    history.base_steps = target.base_steps
    return history


def refine_log_prob(
    log_likelihood,
    mean,
    stddev,
    prior_loc=0.0,
    prior_scale=1.0,
    num_samples=100,
    num_stages=5,
    variance_ratio=0.7,
    variances=None,
    steps_per_stage=None,
    learning_rate=None,
    seed=None,
    verbose=0,
    dtype="float64",
    eval_samples=64,
):
    """Local refinement on a log density, through the functional door (toys, hierarchical models).

    The log joint is log N(w; prior_loc, prior_scale^2) + log_likelihood(w): any log density can be written
    so, with a Gaussian reference of one's choice and the rest in `log_likelihood` (the bound stays exact).

    Further arguments:

    - mean, stddev: (D,) the base diagonal Gaussian q_0 (e.g. from `fit_mean_field`).
    - prior_loc, prior_scale: the Gaussian prior (scalars or (D,)).

    Args:
        log_likelihood: (M, D) -> (M,) tensor function, differentiable.
        num_samples: M refined samples, refined side by side.
        learning_rate: None (default): scale-free, each stage's Adam step is 0.5 x each coordinate's standard
            deviation under q at the stage's start (`RELATIVE_LEARNING_RATE`), so the default needs no
            knowledge of the posterior's scale; a number: as in `refine` (the paper's lr_0 0.3^(k/2)).
        eval_samples: draws per sample for each bound's expected log likelihood.

    The other arguments are `refine`'s.

    Returns:
        (samples (M, D) numpy, `RefinementHistory`).
    """
    _check_positive_int(num_samples, "num_samples")
    target = DensityTarget(
        log_likelihood, mean, stddev, prior_loc, prior_scale, dtype, eval_samples
    )
    d = target.dim
    nu, var = target.base_posterior()
    history = _refine(
        target,
        np.broadcast_to(nu, (num_samples, d)),
        np.broadcast_to(var, (num_samples, d)),
        num_samples,
        num_stages,
        variance_ratio,
        variances,
        steps_per_stage,
        learning_rate,
        seed,
        verbose,
        1.0,
    )
    return target.last_samples, history


def fit_mean_field(
    log_likelihood,
    dim,
    prior_loc=0.0,
    prior_scale=1.0,
    steps=2000,
    learning_rate=1e-2,
    initial_mean=None,
    initial_std=0.1,
    num_restarts=1,
    seed=None,
    dtype="float64",
    eval_samples=256,
):
    """The base of `refine_log_prob`: a diagonal Gaussian fitted by Adam to the ELBO of
    log N(w; prior_loc, prior_scale^2) + log_likelihood(w) (ADVI with the KL to the Gaussian prior in closed
    form), from `num_restarts` starts side by side; the best by its ELBO is returned, with an ELBO
    estimated afresh (16 x `eval_samples` new draws, so not the maximum of the noisy estimates it was chosen
    by).

    Args:
        log_likelihood: (R, D) -> (R,) tensor function.
        dim: D.
        initial_mean: (D,) start, or None: N(prior_loc, prior_scale^2) draws, one per restart.
        initial_std: the starting standard deviation.

    Returns:
        (mean (D,), stddev (D,), elbo) as numpy arrays and a float.
    """
    _check_positive_int(num_restarts, "num_restarts")
    _check_positive_int(dim, "dim")
    rng = np.random.default_rng(seed)
    loc = np.broadcast_to(np.asarray(prior_loc, np.float64), (dim,))
    scale = np.broadcast_to(np.asarray(prior_scale, np.float64), (dim,))
    target = DensityTarget(log_likelihood, loc, np.ones(dim), loc, scale, dtype, eval_samples)
    if initial_mean is None:
        start = loc + scale * rng.standard_normal((num_restarts, dim))
    else:
        start = np.broadcast_to(np.asarray(initial_mean, np.float64), (num_restarts, dim))
    stages = ConditionalGaussians(num_restarts, dim, dtype, 0 if seed is None else int(seed))
    stages.start(
        start, np.full((num_restarts, dim), float(initial_std) ** 2), loc, scale**2, learning_rate
    )
    step = tf.function(lambda: stages.step(lambda w: target.value_and_gradient(w, ())))
    for _ in range(int(steps)):
        step()
    mean, var = stages.moments()
    kl = auxiliary.normal_kl(mean, var, loc, scale**2).sum(1)
    best = int(np.argmax(target.expected_log_likelihood(stages) - kl))
    # The maximum over restarts of noisy estimates is biased upward: the reported ELBO is a fresh estimate
    # from 16 x eval_samples new draws (independent of the choice), unbiased for the returned q.
    fresh = np.mean([target.expected_log_likelihood(stages)[best] for _ in range(16)])
    elbo = fresh - kl[best]
    return mean[best], np.sqrt(var[best]), float(elbo)


def _refine(
    target,
    nu,
    var,
    m,
    num_stages,
    variance_ratio,
    variances,
    steps_per_stage,
    learning_rate,
    seed,
    verbose,
    units,
):
    """The stages (Algorithm 1, all M samples at once); `units` divides the reported bounds."""
    import time

    _check_positive_int(num_stages, "num_stages")
    fractions = auxiliary.variance_schedule(num_stages, variance_ratio, variances)
    if steps_per_stage is not None and (
        isinstance(steps_per_stage, bool)
        or not isinstance(steps_per_stage, (int, np.integer, float))
        or int(steps_per_stage) != steps_per_stage
        or steps_per_stage < 0
    ):
        raise ValueError(
            f"steps_per_stage must be a non-negative integer or None (until converged); got "
            f"{steps_per_stage!r}."
        )
    if learning_rate is not None and (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, (int, float, np.number))
        or not np.isfinite(learning_rate)
        or not learning_rate > 0
    ):
        raise ValueError(
            f"learning_rate must be a positive number or None (scale-free); got {learning_rate!r}."
        )
    start = time.perf_counter()
    seed = np.random.SeedSequence(seed).generate_state(1)[0] if seed is None else int(seed)
    rng = np.random.default_rng(seed)
    prior_loc, prior_var = target.prior()
    stages = ConditionalGaussians(m, target.dim, target.dtype, seed)
    # One step and its stage objective's estimate, mean over the M samples of ell(w_m) - KL(q_m || prior_m).
    step = tf.function(
        lambda batch: tf.reduce_mean(
            stages.step(lambda w: target.value_and_gradient(w, batch)) - stages.kl()
        )
    )
    b, s2 = (
        np.broadcast_to(prior_loc, nu.shape).astype(np.float64),
        np.broadcast_to(prior_var, nu.shape[1:]),
    )
    nu, var = np.array(nu, np.float64), np.array(var, np.float64)
    stages.start(nu, var, b, s2, 1e-3 if learning_rate is None else learning_rate)
    bounds = [target.expected_log_likelihood(stages) - auxiliary.normal_kl(nu, var, b, s2).sum(1)]
    log_ratios = np.zeros(m)
    rates, taken = [], 0
    total = (num_stages - 1) * (
        MAX_STEPS_PER_STAGE if steps_per_stage is None else int(steps_per_stage)
    )
    # Stages that run until they converge have no known length: the bar then counts stages (the last one
    # samples the base posterior), with the steps taken as a metric.
    adaptive = steps_per_stage is None
    bar = (
        keras.utils.Progbar(
            num_stages if adaptive else total,
            unit_name="stage" if adaptive else "step",
            stateful_metrics=["stage", "steps", "elbo_aux"],
        )
        if verbose and total
        else None
    )
    for k, fraction in enumerate(fractions, start=1):
        sigma2 = fraction * prior_var
        s2_next = s2 - sigma2
        a_mean, a_var = auxiliary.auxiliary_distribution(nu, var, b, s2, sigma2)
        a = a_mean + np.sqrt(a_var) * rng.standard_normal(nu.shape)
        # Eq. 13's price of fixing a_k: log q_{k-1}(a_k) - log p(a_k), p(a_k) = N(0, sigma_k^2)
        log_ratios += (
            auxiliary.normal_log_prob(a, a_mean, a_var) - auxiliary.normal_log_prob(a, 0.0, sigma2)
        ).sum(1)
        nu, var = auxiliary.conditional_posterior(a, nu, var, b, s2, sigma2)
        b, s2 = b + a, s2_next
        # scale-free: Adam steps of a tenth of each coordinate's current sd
        if learning_rate is None:
            rate = RELATIVE_LEARNING_RATE * np.sqrt(var)
        else:
            # the paper's lr_0 * 0.3^(k/2)
            rate = learning_rate * np.sqrt(float(np.mean(s2 / prior_var)))
        stages.start(nu, var, b, s2, rate)
        if k < num_stages:
            rates.append(float(np.mean(rate)))
            budget = MAX_STEPS_PER_STAGE if steps_per_stage is None else int(steps_per_stage)
            objectives, polishing = [], False
            for i in range(budget):
                objectives.append(float(step(target.next_batch())))
                taken += 1
                if bar is not None:
                    bar.update(k - 1 if adaptive else taken, [("stage", k), ("steps", taken)])
                if (
                    steps_per_stage is None
                    and (i + 1) % STAGE_WINDOW == 0
                    and stage_converged(objectives)
                ):
                    if polishing:
                        break
                    # A plateau at the stage's rate: continue at a tenth of it (Adam's iterates jitter in
                    # proportion to the rate), until that plateaus too.
                    stages.learning_rate.assign(stages.learning_rate * POLISH_FACTOR)
                    objectives, polishing = [], True
            nu, var = stages.moments()
        bounds.append(
            target.expected_log_likelihood(stages)
            - log_ratios
            - auxiliary.normal_kl(nu, var, b, s2).sum(1)
        )
        if bar is not None:
            done = k if adaptive else taken
            elbo = float(np.mean(bounds[-1])) / units
            bar.update(done, [("stage", k), ("steps", taken), ("elbo_aux", elbo)])
    target.assign_samples(stages.sample())  # the refined samples, one per slot, from the last q
    return RefinementHistory(
        np.stack(bounds) / units, rates, taken, seconds=time.perf_counter() - start
    )


MAX_STEPS_PER_STAGE = 5000
RELATIVE_LEARNING_RATE = 0.5
POLISH_FACTOR = 0.1
STAGE_WINDOW = 200


def stage_converged(objectives, window=STAGE_WINDOW, z=2.0):
    """Whether a stage's objective has stopped improving: the mean of its last `window` per-step estimates is
    no more than z standard errors above the mean of the `window` before (each standard error from its own
    window's spread). False before two full windows."""
    if len(objectives) < 2 * window:
        return False
    last, before = np.asarray(objectives[-window:]), np.asarray(objectives[-2 * window : -window])
    se = np.sqrt(last.var(ddof=1) / window + before.var(ddof=1) / window)
    return bool(last.mean() - before.mean() <= z * se)


def _check_positive_int(value, name):
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}.")
