"""2-D toys of the matrix-valued-kernel SVGD paper: vanilla SVGD vs Matrix-SVGD (average, mixture).

What is measured: the squared MMD between the 50 particles and exact samples of the target, at every
iteration (0..T), for

  vanilla   bk.optimizers.SVGD (RBF kernel, median bandwidth h = med / log N)
  average   bk.optimizers.MatrixSVGD(mode="average") with the exact Hessian (HessianPreconditioner)
  mixture   bk.optimizers.MatrixSVGD(mode="mixture") with the exact Hessian, anchors = particles

all run through the functional door (bk.run_particles), 50 particles, the same initial
particles x0 ~ N(0, 1.5^2 I) per seed (the paper's setting), T = 300 iterations.

Targets (the authors' definitions, dilinwang820/matrix_svgd 2d_toy/code/environment.py and run_exp.py,
reproduced here from their formulas; the paper's text does not define them):
  star           equal mixture of 5 Gaussians, means 1.5 (cos t_k, -sin t_k), t_k = 2 pi k / 5,
                 covariance R_k diag(1, 1/100) R_k^T (each arm elongated along its radius).
                 Exact samples: drawn directly from the mixture.
  double_banana  log p(x) = -||x||^2 / 2 - (F(x) - log 30)^2 / (2 * 0.09),
                 F(x) = log(x1^2 + 100 (x2 - x1^2)^2 + 1e-10)  (a = 0, b = 100, prior variance 1,
                 observation variance 0.09, y = log 30). Exact samples: rejection sampling with the
                 N(0, I) proposal, accepted with probability exp(-(F(x) - y)^2 / 0.18) <= 1: the
                 unnormalised density is N(0, I) times that factor, so accepted draws are exact.
                 (acceptance ~10%)
Curvature: the exact Hessian of -log p at each particle by autodiff, symmetrised, eigenvalues clipped
from below at `--min-eigenvalue` (default 1e-2; the star mixture's Hessian is indefinite between the
arms, the banana's along the ridge). Never a raw inverse. (The authors' code uses PSD surrogates
instead: responsibility-weighted precisions for the star, Gauss-Newton for the banana.)

MMD: k(x, y) = exp(-||x - y||^2 / (2 s^2)) with the fixed bandwidth s = 0.5 (`--mmd-bandwidth`):
MMD^2 = mean_{i,i'} k(x_i, x_i') - 2 mean_{i,m} k(x_i, y_m) + mean_{m != m'} k(y_m, y_m'), over the 50
particles (V-statistic: the particles are the approximation being judged) and M = 10,000 exact
samples (U-statistic for the constant last term). The Monte Carlo error of the estimate from M is
~1e-4, far below the values compared.

Protocol: the paper searched "the best learning rate for all algorithms exhaustively" and used
Adagrad (authors' code: element-wise per particle, step 0.7, 300 iterations). Here every method is run
with each step rule in {"sgd", "rmsprop" (bayes_keras' dimension-wise RMSProp), "adagrad" (the
authors' element-wise Adagrad, defined below)} and each learning rate of a grid; the best
(rule, learning rate) of a method is the one with the smallest mean MMD^2 over the last 20
iterations, on seed 0. Reported for the best configurations: MMD^2 vs iteration (mean over seeds),
the final MMD^2, and the first iteration at which each method's MMD^2 reaches vanilla SVGD's final
MMD^2 ("-" if never).

Usage:
    python benchmarks/svgd_toys.py            # full grid, 10 seeds (~12 minutes on 2 CPU cores)
    python benchmarks/svgd_toys.py --quick    # small grid, 1 seed
Writes benchmarks/results/svgd_toys.{json,md,png}.

MatrixSVGD runs the paper's plain iteration x <- x + learning_rate * phi (`rescaling="none"`) at the learning
rates given here; the library's default (rescaling="auto") scales the step by a quadratic model (see its
docstring), so these tables were measured, and reproduce, without it.
"""

import argparse
import datetime
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bayes_keras as bk  # noqa: E402
import harness  # noqa: E402
from bayes_keras.core.step_rules import StepRule  # noqa: E402

RESULTS = harness.RESULTS_DIR
# (name, mode, curvature source); "hessian": exact Hessian of -log p, eigenvalue-clipped;
# "surrogate": the authors' PSD curvature (Gauss-Newton / responsibility-weighted precisions).
METHODS = (
    ("vanilla", None, None),
    ("average", "average", "hessian"),
    ("mixture", "mixture", "hessian"),
    ("average_surrogate", "average", "surrogate"),
    ("mixture_surrogate", "mixture", "surrogate"),
)
NAMES = tuple(m[0] for m in METHODS)


class ElementwiseAdagrad(StepRule):
    """The authors' toy step rule: per particle and coordinate, G += d^2, step = lr d / sqrt(G + 1e-12)."""

    def slots(self, shape):
        return {"g": tuple(shape)}

    def apply(self, direction, state, learning_rate, step):
        g = state["g"] + tf.square(direction)
        return learning_rate * direction / tf.sqrt(g + 1e-12), {"g": g}


def step_rule(name):
    return ElementwiseAdagrad() if name == "adagrad" else name


# -- targets ---------------------------------------------------------------------------------------
def star(num_components=5, radius=1.5, skewness=100.0):
    theta = 2 * np.pi / num_components
    rot = np.array([[np.cos(theta), np.sin(theta)], [-np.sin(theta), np.cos(theta)]])
    mus, covs = [radius * np.array([1.0, 0.0])], [np.diag([1.0, 1.0 / skewness])]
    for _ in range(1, num_components):
        mus.append(rot @ mus[-1])
        covs.append(rot @ covs[-1] @ rot.T)
    mus, covs = np.array(mus), np.array(covs)
    precs = np.linalg.inv(covs)
    mu_t, prec_t = tf.constant(mus, tf.float32), tf.constant(precs, tf.float32)
    const = tf.constant(
        0.5 * np.linalg.slogdet(precs)[1] - np.log(2 * np.pi) - np.log(num_components), tf.float32
    )

    def log_prob(x):
        diff = x[:, None, :] - mu_t[None]  # (N, K, 2)
        quad = tf.einsum("nkd,kde,nke->nk", diff, prec_t, diff)
        return tf.reduce_logsumexp(-0.5 * quad + const[None], axis=1)

    def sample(m, rng):
        comp = rng.integers(num_components, size=m)
        chol = np.linalg.cholesky(covs)
        return mus[comp] + np.einsum("mij,mj->mi", chol[comp], rng.standard_normal((m, 2)))

    def surrogate(x):
        """The authors' PSD curvature: responsibility-weighted component precisions sum_k r_k(x) P_k."""
        diff = x[:, None, :] - mu_t[None]
        resp = tf.nn.softmax(
            -0.5 * tf.einsum("nkd,kde,nke->nk", diff, prec_t, diff) + const[None], axis=1
        )
        return tf.einsum("nk,kde->nde", resp, prec_t)

    return log_prob, sample, surrogate


def double_banana(a=0.0, b=100.0, prior_var=1.0, y_var=0.09, y=np.log(30.0)):
    def forward_np(x):
        return np.log((a - x[:, 0]) ** 2 + b * (x[:, 1] - x[:, 0] ** 2) ** 2 + 1e-10)

    def log_prob(x):
        f = tf.math.log((a - x[:, 0]) ** 2 + b * (x[:, 1] - x[:, 0] ** 2) ** 2 + 1e-10)
        return -tf.reduce_sum(x * x, axis=1) / (2 * prior_var) - (f - y) ** 2 / (2 * y_var)

    def sample(m, rng):
        out = []
        while sum(len(o) for o in out) < m:
            x = rng.standard_normal((20 * m, 2)) * np.sqrt(prior_var)
            accept = rng.random(len(x)) < np.exp(-((forward_np(x) - y) ** 2) / (2 * y_var))
            out.append(x[accept])
        return np.concatenate(out)[:m]

    def surrogate(x):
        """The authors' PSD curvature: Gauss-Newton, I / prior_var + J J^T / y_var with J = grad F."""
        x1, x2 = x[:, 0], x[:, 1]
        e = (a - x1) ** 2 + b * (x2 - x1**2) ** 2 + 1e-10
        jac = (
            tf.stack([2 * (x1 - a) + 4 * b * x1 * (x1**2 - x2), 2 * b * (x2 - x1**2)], 1)
            / e[:, None]
        )
        eye = tf.eye(2, batch_shape=[tf.shape(x)[0]], dtype=x.dtype)
        return eye / prior_var + jac[:, :, None] * jac[:, None, :] / y_var

    return log_prob, sample, surrogate


TARGETS = {"star": star, "double_banana": double_banana}


# -- MMD -------------------------------------------------------------------------------------------
class MMD:
    """Squared MMD to a fixed exact sample (see the module docstring)."""

    def __init__(self, samples, bandwidth):
        self.y = samples
        self.s2 = 2.0 * bandwidth**2
        total, count = 0.0, 0
        for start in range(0, len(samples), 1000):  # U-statistic of k(y, y'), in chunks
            block = np.exp(-_sq(samples[start : start + 1000], samples) / self.s2)
            total += block.sum() - np.trace(block[:, start : start + 1000])
            count += block.size - min(1000, len(samples) - start)
        self.kyy = total / count

    def __call__(self, x):
        kxx = np.exp(-_sq(x, x) / self.s2).mean()
        kxy = np.exp(-_sq(x, self.y) / self.s2).mean()
        return kxx - 2.0 * kxy + self.kyy


def _sq(a, b):
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None] - 2.0 * a @ b.T, 0.0)


# -- runs ------------------------------------------------------------------------------------------
def make_optimizer(method, config, surrogate, min_eigenvalue):
    _, mode, source = method
    rule, lr, shrinkage = config
    if mode is None:
        return bk.optimizers.SVGD(lr, step_rule=step_rule(rule))
    if source == "hessian":
        pre = bk.preconditioners.HessianPreconditioner(
            min_eigenvalue=min_eigenvalue, shrinkage=shrinkage
        )
    else:
        pre = bk.preconditioners.CallablePreconditioner(
            surrogate, min_eigenvalue=min_eigenvalue, shrinkage=shrinkage
        )
    return bk.optimizers.MatrixSVGD(lr, pre, mode=mode, step_rule=step_rule(rule), rescaling="none")


def run_one(log_prob, surrogate, x0, method, config, iters, mmd, min_eigenvalue):
    opt = make_optimizer(method, config, surrogate, min_eigenvalue)
    t0 = time.perf_counter()
    run = bk.run_particles(log_prob, x0, opt, iters, record_trajectory=True)
    seconds = time.perf_counter() - t0
    traj = run.trajectory.astype(np.float64)
    curve = np.array([mmd(p) if np.all(np.isfinite(p)) else np.nan for p in traj])
    entropy = float(opt.mixture_weight_entropy) if method[1] == "mixture" else None
    return {
        "mmd2": curve,
        "particles": traj[-1],
        "seconds": seconds,
        "entropy": entropy,
        "skipped": int(run.skipped_steps) + int(getattr(opt, "skipped_curvature_steps", 0)),
    }


def tail_score(curve, k=20):
    c = curve[-k:]
    return float(np.mean(c)) if np.all(np.isfinite(c)) else float("inf")


def grid_for(method, quick):
    """(step rule, learning rate, shrinkage) candidates of a method."""
    _, mode, _ = method
    if mode is None:
        rules = {
            "sgd": [0.01, 0.03, 0.1, 0.3],
            "rmsprop": [0.003, 0.01, 0.03, 0.1],
            "adagrad": [0.1, 0.3, 0.7, 1.5],
        }
        if quick:
            rules = {"sgd": [0.03], "adagrad": [0.7]}
    else:  # Q^{-1} makes the step scale-free: larger SGD steps
        rules = {
            "sgd": [0.03, 0.1, 0.3, 1.0],
            "rmsprop": [0.003, 0.01, 0.03, 0.1],
            "adagrad": [0.1, 0.3, 0.7, 1.5],
        }
        if quick:
            rules = {"sgd": [0.3], "adagrad": [0.7]}
    # shrinkage only changes the mixture (the average of the Q_l is unchanged by it)
    shrinks = [0.0, 0.5] if mode == "mixture" else [0.0]
    return [(rule, lr, sh) for rule, lrs in rules.items() for lr in lrs for sh in shrinks]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--particles", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--mmd-bandwidth", type=float, default=0.5)
    parser.add_argument("--min-eigenvalue", type=float, default=1e-2)
    parser.add_argument("--exact-samples", type=int, default=10000)
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    started = time.time()
    report = {
        "config": vars(args)
        | {"seeds": seeds, "grids": {m[0]: grid_for(m, args.quick) for m in METHODS}},
        "toys": {},
    }
    plots = {}
    for toy, make in TARGETS.items():
        log_prob, sampler, surrogate = make()
        mmd = MMD(sampler(args.exact_samples, np.random.default_rng(12345)), args.mmd_bandwidth)
        x0s = [
            np.random.default_rng(40 + s).standard_normal((args.particles, 2)) * 1.5
            for s in range(seeds)
        ]
        toy_report = {"grid": {}, "best": {}}
        best_runs = {}
        for method in METHODS:
            name = method[0]
            candidates = []
            for config in grid_for(method, args.quick):
                r = run_one(
                    log_prob,
                    surrogate,
                    x0s[0],
                    method,
                    config,
                    args.iters,
                    mmd,
                    args.min_eigenvalue,
                )
                score = tail_score(r["mmd2"])
                toy_report["grid"]["%s/%s/lr=%s/shrinkage=%s" % ((name,) + config)] = {
                    "mmd2_last20_mean": score,
                    "seconds": r["seconds"],
                    "skipped": r["skipped"],
                }
                candidates.append((score, config, r))
                print(
                    f"{toy:14s} {name:18s} {config} last-20 MMD^2 = {score:.3e} ({r['seconds']:.1f} s)",
                    flush=True,
                )
            score, config, r0 = min(candidates, key=lambda c: c[0])
            runs = [r0] + [
                run_one(
                    log_prob, surrogate, x0, method, config, args.iters, mmd, args.min_eigenvalue
                )
                for x0 in x0s[1:]
            ]
            best_runs[name] = runs
            curves = np.array([r["mmd2"] for r in runs])
            toy_report["best"][name] = {
                "step_rule": config[0],
                "learning_rate": config[1],
                "shrinkage": config[2],
                "mmd2_mean_curve": curves.mean(0).tolist(),
                "mmd2_final_per_seed": curves[:, -1].tolist(),
                "final_mmd2": float(curves[:, -1].mean()),
                "mixture_weight_entropy_final": [r["entropy"] for r in runs]
                if method[1] == "mixture"
                else None,
                "skipped_steps": [r["skipped"] for r in runs],
                "seconds_per_run": float(np.mean([r["seconds"] for r in runs])),
            }
        target = toy_report["best"]["vanilla"]["final_mmd2"]
        for name in NAMES:
            best = toy_report["best"][name]
            best["iterations_to_vanilla_final"] = harness.first_reach(
                best["mmd2_mean_curve"], target, higher_is_better=False
            )
            best["iterations_to_vanilla_final_per_seed"] = [
                harness.first_reach(r["mmd2"], target, higher_is_better=False)
                for r in best_runs[name]
            ]
        toy_report["final_particles_seed0"] = {
            m: best_runs[m][0]["particles"].tolist() for m in NAMES
        }
        report["toys"][toy] = toy_report
        plots[toy] = log_prob
    report["environment"] = {
        "machine": f"{os.cpu_count()} CPU cores ({platform.machine()})",
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_seconds": round(time.time() - started, 1),
        "command": "python benchmarks/svgd_toys.py" + (" --quick" if args.quick else ""),
    }
    harness.save_results("svgd_toys", report, markdown(report), RESULTS, indent=1)
    plot(report, plots, os.path.join(RESULTS, "svgd_toys.png"))
    print(markdown(report))


def markdown(report):
    cfg = report["config"]
    lines = [
        "# SVGD vs Matrix-SVGD on the 2-D toys",
        "",
        f"{cfg['particles']} particles, x0 ~ N(0, 1.5^2 I), {cfg['iters']} iterations, {cfg['seeds']} seed(s); "
        f"squared MMD (RBF, fixed bandwidth s = {cfg['mmd_bandwidth']}) to {cfg['exact_samples']} exact samples. "
        "Best (step rule, learning rate, shrinkage) per method chosen on seed 0 by the mean MMD^2 of the last "
        "20 iterations; the curves, final MMD^2 and iteration counts are for the mean curve over seeds "
        "(per-seed counts alongside). Curvature: 'hessian' = exact Hessian of -log p, eigenvalues clipped "
        f"at {cfg['min_eigenvalue']}; 'surrogate' = the authors' PSD curvature (star: responsibility-weighted "
        "component precisions; double banana: Gauss-Newton).",
        "",
        "| toy | method | curvature | step rule | lr | shrinkage | final MMD^2 | iterations to vanilla's final "
        "MMD^2 | per seed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for toy, t in report["toys"].items():
        for name, mode, source in METHODS:
            b = t["best"][name]
            it = b["iterations_to_vanilla_final"]
            per = ", ".join(
                "-" if v is None else str(v) for v in b["iterations_to_vanilla_final_per_seed"]
            )
            lines.append(
                f"| {toy} | {mode or 'vanilla'} | {source or '-'} | {b['step_rule']} | {b['learning_rate']} | "
                f"{b['shrinkage'] if mode == 'mixture' else '-'} | {b['final_mmd2']:.2e} | "
                f"{'-' if it is None else it} | {per} |"
            )
    entropies = []
    for toy, t in report["toys"].items():
        for name in ("mixture", "mixture_surrogate"):
            e = t["best"][name]["mixture_weight_entropy_final"]
            entropies.append(f"{toy}/{name}: {', '.join(f'{v:.2f}' for v in e)}")
    lines += [
        "",
        "'-': never reached within the run. Mixture weight entropy after the last step (nats; uniform "
        f"= log {cfg['particles']} = {np.log(cfg['particles']):.2f}): "
        + "; ".join(entropies)
        + ".",
        "",
        "Method and targets: see the docstring of benchmarks/svgd_toys.py; the whole grid is in "
        "svgd_toys.json.",
        "",
        f"Machine: {report['environment']['machine']}, TensorFlow {report['environment']['tensorflow']}, "
        f"{report['environment']['date']}, {report['environment']['wall_seconds']} s. Command: "
        f"`{report['environment']['command']}`",
        "",
    ]
    return "\n".join(lines)


def plot(report, plots, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    toys = list(report["toys"])
    shown = ("vanilla", "average_surrogate", "mixture_surrogate", "average", "mixture")
    fig, axes = plt.subplots(
        len(toys), 1 + len(shown), figsize=(3.6 * (1 + len(shown)), 3.8 * len(toys))
    )
    grid = np.linspace(-3, 3, 200)
    gx, gy = np.meshgrid(grid, grid)
    pts = np.stack([gx.ravel(), gy.ravel()], 1).astype(np.float32)
    for row, toy in zip(axes, toys):
        t = report["toys"][toy]
        for name in NAMES:
            b = t["best"][name]
            curve = np.array(b["mmd2_mean_curve"])
            row[0].plot(
                np.log10(np.maximum(curve, 1e-8)),
                label=f"{name} ({b['step_rule']} {b['learning_rate']})",
            )
        row[0].axhline(
            np.log10(max(t["best"]["vanilla"]["final_mmd2"], 1e-8)), color="gray", ls=":", lw=0.8
        )
        row[0].set(title=f"{toy}: log10 MMD^2 (mean over seeds)", xlabel="iteration")
        row[0].legend(fontsize=7)
        dens = np.exp(plots[toy](tf.constant(pts)).numpy()).reshape(gx.shape)
        for ax, name in zip(row[1:], shown):
            ax.contourf(gx, gy, dens, levels=20, cmap="Blues")
            p = np.array(t["final_particles_seed0"][name])
            ax.scatter(p[:, 0], p[:, 1], s=6, c="crimson")
            ax.set(title=f"{name}, it. {report['config']['iters']}", xlim=(-3, 3), ylim=(-3, 3))
            ax.set_aspect("equal")
    fig.tight_layout()
    fig.savefig(path, dpi=72)


if __name__ == "__main__":
    main()
