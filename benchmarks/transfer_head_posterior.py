"""What a Bayesian head on frozen features reaches in a fine-tune's budget, against its Laplace posterior.

examples/transfer_digits.py's backbone (MobileNetV2, alpha 0.35, pretrained on digits 0-4 with random shifts,
seed 0) is frozen; its pooled features (1,280 per image) of the digits 5-9 training split are the data of a
softmax head (6,405 weights, prior N(0, 1) per weight as bayesianize's default). The head is trained on the
features, as bayesianize(bayesian=["head"]) trains it on the frozen backbone, with N = 10 particles, batch 64,
for a fine-tune's 20 epochs and for 10x as long, by GaussianParticleFlow() and MGVBP(); the Keras head (Adam
1e-3) and the deep ensemble of heads beside them. Reference: the Laplace approximation of the same posterior
(MAP by L-BFGS, exact Hessian of the negative log joint there, float64, 1,000 draws), whose predictive is what
a Bayesian head should approach here. Scores on the test digits 5-9: accuracy / NLL / ECE and the OOD AUROC of
the predictive entropy against the test digits 0-4; and the mean over weights of the particles' (or the
Laplace posterior's) sd of the head kernel.

    python benchmarks/transfer_head_posterior.py [--epochs 20 200] [--particles 10]
Writes benchmarks/results/transfer_head_posterior.{json,md}.
"""

import argparse
import os
import sys
import time

import numpy as np
from scipy.linalg import solve_triangular
from scipy.optimize import minimize
from scipy.special import log_softmax, softmax

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import harness  # noqa: E402
import transfer_digits  # noqa: E402

import keras  # noqa: E402

import bayes_keras as bk  # noqa: E402


def scores(probs, probs_ood, y):
    s = bk.metrics.evaluate_probs(probs.astype("float32"), y)
    s["ood_auroc"] = bk.metrics.auroc(
        transfer_digits.entropy(probs), transfer_digits.entropy(probs_ood)
    )
    return {k: float(v) for k, v in s.items() if k in ("accuracy", "nll", "ece", "ood_auroc")}


def laplace(x, y, x_test, x_ood, prior_variance, draws, seed):
    """The Laplace approximation's predictive and mean kernel sd (weights (F + 1) x K, the bias as a last row)."""
    add_bias = lambda a: np.hstack([a, np.ones((len(a), 1))]).astype(np.float64)  # noqa: E731
    x, x_test, x_ood = add_bias(x), add_bias(x_test), add_bias(x_ood)
    f, k = x.shape[1], int(y.max()) + 1
    onehot = np.eye(k)[y]

    def objective(w):
        w = w.reshape(f, k)
        logits = x @ w
        grad = x.T @ (softmax(logits, 1) - onehot) + w / prior_variance
        return -np.sum(onehot * log_softmax(logits, 1)) + 0.5 * np.sum(
            w * w
        ) / prior_variance, grad.ravel()

    w_map = minimize(
        objective, np.zeros(f * k), jac=True, method="L-BFGS-B", options={"maxiter": 10000}
    ).x
    p = softmax(x @ w_map.reshape(f, k), 1)
    hessian = np.empty((f, k, f, k))
    for a in range(k):  # sum_n x_n x_n^T (diag(p_n) - p_n p_n^T)[a, b]
        for b in range(k):
            c = (a == b) * p[:, a] - p[:, a] * p[:, b]
            hessian[:, a, :, b] = (x * c[:, None]).T @ x
    hessian = hessian.reshape(f * k, f * k) + np.eye(f * k) / prior_variance
    # H = L L^T, so H^-1 = L^-T L^-1: draws L^-T z have covariance H^-1, and diag(H^-1) is L^-1's column norms
    chol_inverse = solve_triangular(np.linalg.cholesky(hessian), np.eye(f * k), lower=True)
    z = np.random.default_rng(seed).standard_normal((f * k, draws))
    samples = w_map[:, None] + chol_inverse.T @ z
    predictive = lambda a: np.mean([softmax(a @ s.reshape(f, k), 1) for s in samples.T], axis=0)  # noqa: E731
    kernel_sd = np.sqrt(np.sum(chol_inverse**2, axis=0)).reshape(f, k)[:-1].mean()
    return (
        predictive(x_test),
        predictive(x_ood),
        softmax(x_test @ w_map.reshape(f, k), 1),
        softmax(x_ood @ w_map.reshape(f, k), 1),
        float(kernel_sd),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--particles", type=int, default=10)
    parser.add_argument("--pretrain-epochs", type=int, default=40)
    parser.add_argument("--draws", type=int, default=1000)
    args = parser.parse_args()
    pretrain, (x, y), (x_test, y_test), x_ood = transfer_digits.digits_split()
    backbone = transfer_digits.pretrained_backbone(pretrain, args.pretrain_epochs, 0.35)
    features = lambda a: backbone.predict(a, verbose=0)  # noqa: E731
    fx, fx_test, fx_ood = features(x), features(x_test), features(x_ood)
    rows = {}

    def head():
        return keras.Sequential(
            [keras.Input((fx.shape[1],)), keras.layers.Dense(5, activation="softmax", name="head")]
        )

    for epochs in args.epochs:
        keras.utils.set_random_seed(0)
        model = head()
        model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
        model.fit(fx, y, epochs=epochs, batch_size=64, verbose=0)
        rows[f"Keras head, {epochs} epochs"] = scores(
            model.predict(fx_test, verbose=0), model.predict(fx_ood, verbose=0), y_test
        )
        for name, optimizer in (
            ("GaussianParticleFlow()", bk.optimizers.GaussianParticleFlow),
            ("MGVBP()", bk.optimizers.MGVBP),
            ("ensemble of heads", bk.optimizers.IndependentParticles),
        ):
            keras.utils.set_random_seed(0)
            model = bk.bayesianize(head(), num_particles=args.particles, seed=0)
            model.compile(optimizer=optimizer())
            start = time.perf_counter()
            model.fit(fx, y, epochs=epochs, batch_size=64, verbose=0)
            row = scores(
                model.predict(fx_test, verbose=0), model.predict(fx_ood, verbose=0), y_test
            )
            row["kernel_sd"] = float(
                np.std(model.get_layer("head").weights[0].numpy(), axis=0).mean()
            )
            row["seconds"] = time.perf_counter() - start
            rows[f"{name}, {epochs} epochs"] = row
            print(f"{name}, {epochs} epochs", row, flush=True)
    test_probs, ood_probs, map_test, map_ood, kernel_sd = laplace(
        fx, y, fx_test, fx_ood, 1.0, args.draws, 0
    )
    rows["MAP (prior N(0, 1))"] = scores(map_test, map_ood, y_test)
    rows[f"Laplace posterior (prior N(0, 1), {args.draws} draws)"] = {
        **scores(test_probs, ood_probs, y_test),
        "kernel_sd": kernel_sd,
    }
    machine = harness.machine_info()
    result = {"command": " ".join(sys.argv), "args": vars(args), "machine": machine, "rows": rows}
    lines = [
        "# A Bayesian head on frozen features against its Laplace posterior",
        "",
        f"`{result['command']}`; features of examples/transfer_digits.py's backbone (seed 0), N = "
        f"{args.particles}, batch 64. Machine: {machine['processor']}, {machine['cpu_count']} CPUs.",
        "",
        "| head | accuracy | NLL | ECE | OOD AUROC | kernel sd |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        sd = f"{r['kernel_sd']:.4f}" if "kernel_sd" in r else ""
        lines.append(
            f"| {name} | {r['accuracy']:.3f} | {r['nll']:.3f} | {r['ece']:.3f} | {r['ood_auroc']:.3f} | "
            f"{sd} |"
        )
    for path in harness.save_results("transfer_head_posterior", result, lines):
        print("wrote", path)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
