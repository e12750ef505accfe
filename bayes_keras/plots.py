"""Plots of a predictive distribution (matplotlib). Every function returns a `matplotlib.figure.Figure`
(nothing is shown or written unless you do: `fig.savefig(path)`).

- reliability_diagram: accuracy against confidence per bin, with the confidence histogram under it.
- regression_intervals: predictive mean and central intervals against one input or the example index.
- uncertainty_vs_error: error rate (or absolute error) as the most uncertain examples are set aside.
- particles_2d: particles (or samples) over the contours of a 2-D log density.
"""

import numpy as np

from bayes_keras.metrics.functions import calibration_curve, class_probabilities, ece


def _figure(**kwargs):
    """A Figure with one axes. matplotlib.figure.Figure, not pyplot: no global state, no display needed."""
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    return fig, fig.subplots()


def reliability_diagram(probs, labels, num_bins=15, title=None):
    """Top-label reliability diagram (Guo et al. 2017, Fig. 1): per equal-width confidence bin, the
    accuracy (bars) and the mean confidence (red marks) against the diagonal of perfect calibration, and
    below, the fraction of examples in each bin. The legend gives the ECE of the same bins. `probs`
    (n, K) or binary (n,)."""
    probs, labels = class_probabilities(probs, labels)
    conf, acc, count = calibration_curve(probs, labels, num_bins)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.5, 5.5), constrained_layout=True)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    centres, width = 0.5 * (edges[:-1] + edges[1:]), 1.0 / num_bins
    filled = count > 0
    top.bar(
        centres[filled],
        acc[filled],
        width=width,
        edgecolor="black",
        color="tab:blue",
        alpha=0.8,
        label=f"accuracy (ECE {ece(probs, labels, num_bins):.4f})",
    )
    top.errorbar(
        centres[filled],
        conf[filled],
        xerr=0.5 * width,
        fmt="none",
        ecolor="tab:red",
        elinewidth=2,
        label="mean confidence in the bin",
    )
    top.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    top.set_ylabel("accuracy")
    top.set_ylim(0, 1)
    top.legend(loc="upper left", fontsize=8)
    if title:
        top.set_title(title)
    bottom.bar(
        centres, count / max(count.sum(), 1.0), width=width, edgecolor="black", color="tab:gray"
    )
    bottom.set_xlabel("confidence (top-label predictive probability)")
    bottom.set_ylabel("fraction")
    bottom.set_xlim(0, 1)
    return fig


def regression_intervals(
    mean, lower, upper, targets=None, x=None, label="95% interval", title=None
):
    """Predictive mean with the band [lower, upper] against `x` (one input feature, (n,)) or, without it,
    against the examples sorted by their predictive mean; targets as dots when given."""
    mean, lower, upper = (np.asarray(a, np.float64).reshape(-1) for a in (mean, lower, upper))
    order = np.argsort(mean if x is None else np.asarray(x).reshape(-1))
    position = np.arange(len(mean)) if x is None else np.asarray(x, np.float64).reshape(-1)[order]
    fig, ax = _figure(figsize=(6, 4), constrained_layout=True)
    ax.fill_between(position, lower[order], upper[order], color="tab:blue", alpha=0.25, label=label)
    ax.plot(position, mean[order], color="tab:blue", lw=1.5, label="predictive mean")
    if targets is not None:
        targets = np.asarray(targets, np.float64).reshape(-1)
        inside = np.mean((targets >= lower) & (targets <= upper))
        ax.scatter(
            position, targets[order], s=8, color="black", label=f"targets ({inside:.0%} inside)"
        )
    ax.set_xlabel("examples sorted by predictive mean" if x is None else "x")
    ax.set_ylabel("y")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return fig


def uncertainty_vs_error(uncertainty, errors, name="predictive entropy", title=None):
    """Mean error of the examples kept when the most uncertain fraction is set aside (a rejection curve):
    falling curves mean the uncertainty knows where the model errs. `errors` (n,): 0/1 mistakes or
    absolute errors; `uncertainty` (n,) any score (higher = less sure)."""
    uncertainty = np.asarray(uncertainty, np.float64).reshape(-1)
    errors = np.asarray(errors, np.float64).reshape(-1)
    if uncertainty.shape != errors.shape:
        raise ValueError(
            f"uncertainty and errors must have the same length; got {uncertainty.shape} and "
            f"{errors.shape}."
        )
    order = np.argsort(uncertainty)  # most certain first
    kept = np.arange(1, len(order) + 1)
    mean_error = np.cumsum(errors[order]) / kept
    fig, ax = _figure(figsize=(5, 4), constrained_layout=True)
    ax.plot(1.0 - kept / len(order), mean_error, color="tab:blue", label=f"set aside by {name}")
    ax.axhline(errors.mean(), color="gray", ls="--", lw=1, label="no rejection")
    ax.set_xlabel("fraction of examples set aside (most uncertain first)")
    ax.set_ylabel("mean error of the rest")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return fig


def particles_2d(particles, log_prob=None, limits=None, resolution=200, title=None):
    """Particles (N, 2) over the contours of a 2-D log density `log_prob` (a function of an (M, 2) array
    returning (M,)), e.g. the toy targets of the SVGD and GPF papers."""
    particles = np.asarray(particles, np.float64)
    if particles.ndim != 2 or particles.shape[1] != 2:
        raise ValueError(f"particles_2d expects particles of shape (N, 2); got {particles.shape}.")
    if limits is None:
        lo, hi = particles.min(0), particles.max(0)
        pad = 0.5 * (hi - lo) + 1e-3
        limits = (lo[0] - pad[0], hi[0] + pad[0], lo[1] - pad[1], hi[1] + pad[1])
    fig, ax = _figure(figsize=(5, 5), constrained_layout=True)
    if log_prob is not None:
        gx, gy = np.meshgrid(
            np.linspace(limits[0], limits[1], resolution),
            np.linspace(limits[2], limits[3], resolution),
        )
        grid = np.stack([gx.ravel(), gy.ravel()], 1)
        density = np.exp(np.asarray(log_prob(grid), np.float64).reshape(gx.shape))
        ax.contourf(gx, gy, density, levels=20, cmap="Blues")
    ax.scatter(
        particles[:, 0],
        particles[:, 1],
        s=12,
        color="tab:red",
        edgecolor="black",
        lw=0.3,
        label=f"{len(particles)} particles",
    )
    ax.set_xlim(limits[0], limits[1])
    ax.set_ylim(limits[2], limits[3])
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return fig
