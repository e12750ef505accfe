"""What MGVBP's structures share in their update: the step sizes, the clipping of the natural gradient,
the step's captured curvature, and the score estimators' bookkeeping (control variates, the layers'
Normal priors in closed form, h = log p - log q). Functions of the optimizer's settings; each structure's
file (mgvbp_diagonal.py, mgvbp_full.py, mgvbp_kronecker.py) calls them from its update.
"""

import keras
import tensorflow as tf

from bayes_keras.priors import Normal


def step_sizes(optimizer, learning_rate, iteration):
    """(beta for P, beta for mu, omega): the first step sets the momentum to the natural gradient."""
    mean_lr = optimizer.mean_learning_rate
    if mean_lr is None:
        mean_lr = learning_rate
    else:
        if isinstance(mean_lr, keras.optimizers.schedules.LearningRateSchedule):
            mean_lr = mean_lr(optimizer.attempted_steps)  # as the learning rate's schedule
        mean_lr = tf.cast(mean_lr, optimizer.posterior_dtype)
    omega = tf.where(
        tf.equal(iteration, 1.0),
        tf.constant(0.0, optimizer.posterior_dtype),
        tf.constant(optimizer.momentum, optimizer.posterior_dtype),
    )
    return learning_rate, mean_lr, omega


def clip(optimizer, nat_mu, nat_p, iteration):
    """The natural gradient scaled to norm at most `gradient_clip` (`initial_gradient_clip` at step 1)."""
    later = optimizer.gradient_clip
    first = (
        later
        if isinstance(optimizer.initial_gradient_clip, str)
        else optimizer.initial_gradient_clip
    )
    if first == later:
        return (nat_mu, nat_p) if later is None else clip_by_norm(nat_mu, nat_p, later)
    bounds = [float("inf") if bound is None else bound for bound in (first, later)]
    bound = tf.where(tf.equal(iteration, 1.0), *(tf.constant(b, nat_mu.dtype) for b in bounds))
    return clip_by_norm(nat_mu, nat_p, bound)


def records(optimizer, step):
    """The step's captured curvature (curvature="empirical_fisher" / "fisher")."""
    if step is None or not step.curvature:
        raise ValueError(
            f"MGVBP curvature={optimizer.curvature!r} needs the layers' captured curvature: train "
            "through BayesianModel.fit, or pass the step of model.bayesian_gradients to apply()."
        )
    return step.curvature


def score_natural_gradient(optimizer, state, block, theta, estimate, log_q, step, writes):
    """(nat_mu, nat_P) of one block of q (its `state`, and `block`: its particle-variable indices) by the
    score estimators, from its (N, D_b) samples `theta`: `estimate` is the structure's score-function
    formula and `log_q(theta, mean, precision)` its log density of q. The control variates of these
    samples are written for the next step."""
    if step is None:
        raise ValueError(
            f"MGVBP estimator='{optimizer.estimator}' needs the per-sample log likelihoods: train "
            "through BayesianModel.fit, or pass the step of model.bayesian_gradients to apply()."
        )
    mean, precision = state["mean"].value, state["precision"].value
    log_lik = tf.cast(step.log_likelihood, optimizer.posterior_dtype)
    c_mu, c_p = state["c_mean"].value, state["c_precision"].value
    if optimizer.estimator == "score":  # the layers' Normal priors and q's entropy in closed form
        prior_mean, prior_precision = prior_vectors(
            optimizer.view, block, optimizer.posterior_dtype, "estimator='score'"
        )
        given = (log_lik, c_mu, c_p, prior_mean, prior_precision / step.temperature)
    else:  # "score_h": h = log p(y, w) - log q(w)
        log_prior = tf.cast(step.log_prior, optimizer.posterior_dtype)
        given = (log_lik + log_prior - log_q(theta, mean, precision), c_mu, c_p)
    nat_mu, nat_p, c_mu, c_p = estimate(theta, mean, precision, *given)
    writes.assign(state["c_mean"], c_mu)
    writes.assign(state["c_precision"], c_p)
    return nat_mu, nat_p


def clip_by_norm(nat_mu, nat_p, max_norm):
    """Scale the stacked estimate (nat_mu, nat_P) down to norm max_norm (the paper's GradientMax)."""
    norm = tf.sqrt(tf.reduce_sum(tf.square(nat_mu)) + tf.reduce_sum(tf.square(nat_p)))
    scale = tf.minimum(tf.constant(1.0, nat_mu.dtype), max_norm / tf.maximum(norm, 1e-30))
    return nat_mu * scale, nat_p * scale


def control_variate(score, f):
    """Per-coordinate optimal baseline c_i = Cov(score_i f, score_i) / Var(score_i) for score (S, ...) and
    f (S,), both moments over the S samples with the same normalisation (the paper's control variates,
    from the previous step's samples)."""
    f = tf.reshape(f, [-1] + [1] * (len(score.shape) - 1))
    sf = score * f
    cov = tf.reduce_mean((sf - tf.reduce_mean(sf, 0)) * (score - tf.reduce_mean(score, 0)), axis=0)
    var = tf.reduce_mean(tf.square(score - tf.reduce_mean(score, 0)), axis=0)
    return tf.math.divide_no_nan(cov, var)


def prior_vectors(view, block, dtype, user):
    """(mean, precision) vectors of the layers' Normal priors over a block's coordinates."""
    means, precisions = [], []
    for i in block:
        if view.priors[i] is None:
            raise ValueError(
                f"MGVBP {user} needs the layers' priors; {view.variables[i].path} belongs to no "
                "bayes_keras particle layer."
            )
        prior, fan_in = view.priors[i]
        if not isinstance(prior, Normal):
            raise ValueError(
                f"MGVBP {user} handles Normal priors in closed form; {view.variables[i].path} has "
                f"{prior!r}. Use estimator='score_h', or estimator='gradient' with curvature='stein'."
            )
        sd = prior.stddev(fan_in)
        means.append(tf.fill((view.sizes[i],), tf.constant(prior.loc, dtype)))
        precisions.append(tf.fill((view.sizes[i],), tf.constant(1.0 / sd**2, dtype)))
    return tf.concat(means, 0), tf.concat(precisions, 0)
