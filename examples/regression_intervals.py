"""Regression with calibrated predictive intervals on raw targets: diabetes, GPF, library defaults.

The Normal likelihood's defaults (learned noise, targets standardised by the first fit and mapped back)
give intervals in the targets' own units (disease progression, 25-346) without any preprocessing of y.
Prints held-out RMSE, test log likelihood and the coverage / width of 95% predictive intervals, and
writes a plot of the intervals (benchmarks/results/regression_intervals_diabetes.png).

    python examples/regression_intervals.py
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import bayes_keras as bk  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--epochs", type=int, default=300, help="at most (early stopping on val_nll)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plot",
        default=os.path.join(
            os.path.dirname(__file__),
            "..",
            "benchmarks",
            "results",
            "regression_intervals_diabetes.png",
        ),
        help="where the plot goes ('' draws none)",
    )
    args = parser.parse_args()
    (x, y), (x_test, y_test) = bk.datasets.load_diabetes(seed=args.seed)  # y in its own units
    keras.utils.set_random_seed(args.seed)
    model = bk.zoo.mlp(x.shape[1], 1, (50,), num_particles=10, likelihood="normal")
    model.compile(
        optimizer=bk.optimizers.GaussianParticleFlow(),
        metrics=[bk.metrics.IntervalCoverage(0.95), bk.metrics.IntervalWidth(0.95), "mae"],
    )
    # the Keras idiom against overfitting: the learned noise follows the training residuals (docs/results.md)
    stop = keras.callbacks.EarlyStopping(monitor="val_nll", patience=20, restore_best_weights=True)
    model.fit(
        x, y, epochs=args.epochs, batch_size=32, validation_split=0.2, callbacks=[stop], verbose=0
    )
    logs = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    dist = model.predictive(x_test)
    mean = model.predict(x_test, verbose=0)["mean"][:, 0]
    lower, upper = dist.quantile(0.025).numpy()[:, 0], dist.quantile(0.975).numpy()[:, 0]
    print(
        f"held-out RMSE {bk.metrics.rmse(mean, y_test):.2f} | test log likelihood "
        f"{bk.metrics.log_likelihood(dist, y_test):.3f} | 95% interval coverage {logs['coverage_95']:.3f}, "
        f"mean width {logs['width_95']:.1f} | learned noise sd {float(model.likelihood.noise_scale()[0]):.1f}"
    )
    if args.plot:
        os.makedirs(os.path.dirname(args.plot), exist_ok=True)
        fig = bk.plots.regression_intervals(
            mean, lower, upper, y_test, title="diabetes, GPF (defaults)"
        )
        fig.savefig(args.plot, dpi=120)
        print("plot:", os.path.normpath(args.plot))


if __name__ == "__main__":
    main()
