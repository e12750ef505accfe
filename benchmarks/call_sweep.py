"""The call-level bad-input sweep: the public API's calls, each with one bad argument.

fit / evaluate / predict / predictive / uncertainty / predict_particles of a trained BayesianModel,
bayesianize, refine, the metric functions, the datasets, save, load_model and export: each case passes one
bad value (a wrong type, a negative or fractional count, NaN, an array of the wrong shape, labels out of
range, an infinite dataset without steps, a file that is not what it should be...). A case is

- "clear" when the call raises at once (ValueError, TypeError, or for files FileNotFoundError /
  FileExistsError) or warns, with a message that names the argument and the bad value;
- "unclear" when the message does not name both, "obscure" for any other exception, "silent" when the call
  returns without a word (a NaN result without a warning is "silent NaN"), "hang" when it has not returned
  after the timeout.

Every case runs under a timeout in a worker subprocess: a case that hangs is recorded, the worker killed,
and a new one goes on from the next case. tests/training/test_call_sweep.py runs the same sweep.

Usage:
    python benchmarks/call_sweep.py
Writes benchmarks/results/call_sweep.{json,md}.
"""

import atexit
import collections
import json
import math
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CLEAR_ERRORS = ("ValueError", "TypeError", "FileNotFoundError", "FileExistsError")
TIMEOUT_S = 60

CASES = []  # (api, argument(s), value label, call(F), tokens the message must hold)


def case(api, argument, label, call, tokens=None):
    tokens = (label,) if tokens is None else tokens if isinstance(tokens, tuple) else (tokens,)
    CASES.append((api, argument, label, call, tokens))


FRACTIONS = ("0.7", "1.7", "2.7")  # y + 0.7: a message shows one of them
NUMBERS = {"0": 0, "-2": -2, "2.5": 2.5, "'8'": "8", "True": True}


def _prediction_cases():
    for api in ("predict", "predictive", "uncertainty", "predict_particles"):

        def call(F, api=api, **kw):
            return getattr(F.model, api)(**{"x": F.x, **kw})

        for label, value in NUMBERS.items():
            case(api, "batch_size", label, lambda F, c=call, v=value: c(F, batch_size=v))
        case(api, "x", "5 features", lambda F, c=call: c(F, x=F.x5), ("(32, 5)",))
        case(api, "x", "list of lists", lambda F, c=call: c(F, x=F.x.tolist()), ("list",))
        case(api, "x", "a scalar", lambda F, c=call: c(F, x=3.0), ("scalar",))
        case(api, "x", "0 rows", lambda F, c=call: c(F, x=F.x[:0]), ("0 rows",))
        case(api, "x", "None", lambda F, c=call: c(F, x=None), ("None",))
        case(api, "x", "strings", lambda F, c=call: c(F, x=F.strings), ("str", "string", "<U"))
        case(api, "x", "1-D", lambda F, c=call: c(F, x=F.x[:, 0]), ("(32,)",))
        case(api, "x", "NaN rows", lambda F, c=call: c(F, x=F.x_nan), ("NaN",))
        case(api, "x", "Inf rows", lambda F, c=call: c(F, x=F.x_inf), ("Inf",))
        case(api, "x", "infinite dataset", lambda F, c=call: c(F, x=F.infinite_x()), ("infinite",))
        case(api, "x", "dataset of 5 features", lambda F, c=call: c(F, x=F.dataset5()), ("5",))
        if api in ("predict", "predict_particles"):
            for label, value in {"0": 0, "-1": -1, "2.5": 2.5}.items():
                case(api, "steps", label, lambda F, c=call, v=value: c(F, steps=v))
            case(
                api,
                ("steps", "length"),
                "generator without steps",
                lambda F, c=call: c(F, x=F.generator()),
                ("generator",),
            )


def _fit_cases():
    def fit(F, **kw):
        return F.model.fit(**{"x": F.x, "y": F.y, "verbose": 0, **kw})

    for label, value in {**NUMBERS, "nan": math.nan}.items():
        case("fit", "batch_size", label, lambda F, v=value: fit(F, batch_size=v))
    for label, value in {"-1": -1, "2.5": 2.5, "'2'": "2", "True": True, "nan": math.nan}.items():
        case("fit", "epochs", label, lambda F, v=value: fit(F, epochs=v))
    for label, value in {"-1": -1, "2.5": 2.5, "'1'": "1"}.items():
        case("fit", "initial_epoch", label, lambda F, v=value: fit(F, initial_epoch=v))
    case(
        "fit", "initial_epoch", "3 > epochs 2", lambda F: fit(F, epochs=2, initial_epoch=3), ("3",)
    )
    for label, value in {
        "-0.1": -0.1,
        "1.0": 1.0,
        "1.5": 1.5,
        "'0.2'": "0.2",
        "nan": math.nan,
        "True": True,
    }.items():
        case("fit", "validation_split", label, lambda F, v=value: fit(F, validation_split=v))
    case("fit", "sample_weight", "-1", lambda F: fit(F, sample_weight=-F.ones))
    case("fit", "sample_weight", "nan", lambda F: fit(F, sample_weight=F.ones * math.nan))
    case("fit", "sample_weight", "inf", lambda F: fit(F, sample_weight=F.ones * math.inf))
    case(
        "fit",
        "sample_weight",
        "10 weights for 32 rows",
        lambda F: fit(F, sample_weight=F.ones[:10]),
        ("10",),
    )
    case("fit", "sample_weight", "'w'", lambda F: fit(F, sample_weight="w"))
    case(
        "fit",
        "sample_weight",
        "-1 in a tf.data element",
        lambda F: fit(F, x=F.weighted(-1.0), y=None),
        ("negative",),
    )
    case("fit", "class_weight", "-1", lambda F: fit(F, class_weight={0: -1.0, 1: 1.0, 2: 1.0}))
    case("fit", "class_weight", "nan", lambda F: fit(F, class_weight={0: math.nan, 1: 1.0, 2: 1.0}))
    case(
        "fit",
        "class_weight",
        "a list",
        lambda F: fit(F, class_weight=[1.0, 2.0, 3.0]),
        ("[1.0, 2.0, 3.0]",),
    )
    case("fit", "class_weight", "'balanced'", lambda F: fit(F, class_weight="balanced"))
    case("fit", "class_weight", "'a' key", lambda F: fit(F, class_weight={"a": 1.0}), ("'a'",))
    case(
        "fit",
        "class_weight",
        "class 7 of 3",
        lambda F: fit(F, class_weight={0: 1.0, 1: 1.0, 7: 2.0}),
        ("7",),
    )
    case("fit", "x", "5 features", lambda F: fit(F, x=F.x5), ("(32, 5)",))
    case("fit", "x", "list of lists", lambda F: fit(F, x=F.x.tolist()), ("list",))
    case("fit", "x", "a scalar", lambda F: fit(F, x=3.0), ("scalar",))
    case("fit", "x", "0 rows", lambda F: fit(F, x=F.x[:0], y=F.y[:0]), ("0 rows",))
    case("fit", "x", "None", lambda F: fit(F, x=None), ("None",))
    case("fit", "x", "strings", lambda F: fit(F, x=F.strings), ("str", "string", "<U"))
    case("fit", "x", "infinite dataset", lambda F: fit(F, x=F.infinite(), y=None), ("infinite",))
    case("fit", "x", "NaN rows", lambda F: fit(F, x=F.x_nan), ("NaN",))
    case("fit", "y", "None", lambda F: fit(F, y=None))
    case("fit", "y", "10 labels for 32 rows", lambda F: fit(F, y=F.y[:10]), ("10",))
    case("fit", "y", "label 5 of 3 classes", lambda F: fit(F, y=F.y_out), ("5",))
    case("fit", "y", "label -1", lambda F: fit(F, y=-F.ones.astype("int32")), ("-1",))
    case("fit", "y", "label 2.7", lambda F: fit(F, y=F.y + 0.7), FRACTIONS)
    case("fit", "y", "strings", lambda F: fit(F, y=F.y.astype(str)), ("str", "string", "<U"))
    case("fit", "y", "NaN labels", lambda F: fit(F, y=F.y * math.nan), ("NaN", "nan"))
    for label, value in {"0": 0, "-1": -1, "2.5": 2.5, "'2'": "2"}.items():
        case("fit", "steps_per_epoch", label, lambda F, v=value: fit(F, steps_per_epoch=v))
    case(
        "fit",
        "validation_data",
        "5 features",
        lambda F: fit(F, validation_data=(F.x5, F.y)),
        ("5",),
    )
    case("fit", "validation_data", "a 1-tuple", lambda F: fit(F, validation_data=(F.x,)), ("1",))
    case(
        "fit",
        "validation_data",
        "labels 5 of 3",
        lambda F: fit(F, validation_data=(F.x, F.y_out)),
        ("5",),
    )
    case("fit", "refresh_batch_norm", "'yes'", lambda F: fit(F, refresh_batch_norm="yes"))
    case("fit", "callbacks", "'x'", lambda F: fit(F, callbacks="x"))
    case("fit", "callbacks", "[1]", lambda F: fit(F, callbacks=[1]))
    case("fit", "verbose", "'loud'", lambda F: fit(F, verbose="loud"))
    case("fit", "shuffle", "'yes'", lambda F: fit(F, shuffle="yes"))
    for label, value in {
        "0": 0,
        "-1": -1,
        "2.5": 2.5,
        "'10'": "10",
        "nan": math.nan,
        "True": True,
    }.items():
        case("fit", "dataset_size", label, lambda F, v=value: fit(F, dataset_size=v))
    case("fit", "dataset_size", "10 for 32 rows", lambda F: fit(F, dataset_size=10), ("10",))


def _evaluate_cases():
    def evaluate(F, **kw):
        return F.model.evaluate(**{"x": F.x, "y": F.y, "verbose": 0, **kw})

    for label, value in NUMBERS.items():
        case("evaluate", "batch_size", label, lambda F, v=value: evaluate(F, batch_size=v))
    case("evaluate", "x", "5 features", lambda F: evaluate(F, x=F.x5), ("(32, 5)",))
    case("evaluate", "x", "list of lists", lambda F: evaluate(F, x=F.x.tolist()), ("list",))
    case("evaluate", "x", "a scalar", lambda F: evaluate(F, x=3.0), ("scalar",))
    case("evaluate", "x", "0 rows", lambda F: evaluate(F, x=F.x[:0], y=F.y[:0]), ("0 rows",))
    case("evaluate", "x", "NaN rows", lambda F: evaluate(F, x=F.x_nan), ("NaN",))
    case(
        "evaluate",
        "x",
        "infinite dataset",
        lambda F: evaluate(F, x=F.infinite(), y=None),
        ("infinite",),
    )
    case(
        "evaluate",
        ("steps", "length"),
        "generator without steps",
        lambda F: evaluate(F, x=F.generator(labels=True), y=None),
        ("generator",),
    )
    case("evaluate", "y", "None", lambda F: evaluate(F, y=None))
    case("evaluate", "y", "10 labels for 32 rows", lambda F: evaluate(F, y=F.y[:10]), ("10",))
    case("evaluate", "y", "label 5 of 3 classes", lambda F: evaluate(F, y=F.y_out), ("5",))
    case("evaluate", "y", "label 2.7", lambda F: evaluate(F, y=F.y + 0.7), FRACTIONS)
    case("evaluate", "sample_weight", "-1", lambda F: evaluate(F, sample_weight=-F.ones))
    case("evaluate", "sample_weight", "nan", lambda F: evaluate(F, sample_weight=F.ones * math.nan))
    for label, value in {"0": 0, "-1": -1, "2.5": 2.5}.items():
        case("evaluate", "steps", label, lambda F, v=value: evaluate(F, steps=v))


def _bayesianize_cases():
    import bayes_keras as bk

    def convert(F, **kw):
        return bk.bayesianize(**{"model": F.keras_model(), "num_particles": 2, **kw})

    case("bayesianize", "model", "'m'", lambda F: bk.bayesianize("m"))
    case("bayesianize", "model", "None", lambda F: bk.bayesianize(None))
    case(
        "bayesianize",
        "model",
        "an unbuilt Sequential",
        lambda F: bk.bayesianize(F.unbuilt()),
        ("built",),
    )
    for label, value in {**NUMBERS, "nan": math.nan, "None": None}.items():
        case("bayesianize", "num_particles", label, lambda F, v=value: convert(F, num_particles=v))
    for label, value in {
        "-1": -1.0,
        "nan": math.nan,
        "inf": math.inf,
        "'0.1'": "0.1",
        "True": True,
    }.items():
        case("bayesianize", "noise_std", label, lambda F, v=value: convert(F, noise_std=v))
    for label, value in {"'foo'": "foo", "3": 3}.items():
        case("bayesianize", "likelihood", label, lambda F, v=value: convert(F, likelihood=v))
    case(
        "bayesianize",
        "likelihood",
        "'normal' on softmax",
        lambda F: convert(F, likelihood="normal"),
        ("normal",),
    )
    for label, value in {"0": 0, "-1": -1, "2.5": 2.5, "'2'": "2", "True": True}.items():
        case("bayesianize", "lora_rank", label, lambda F, v=value: convert(F, lora_rank=v))
    case(
        "bayesianize",
        "lora_alpha",
        "8 without lora_rank",
        lambda F: convert(F, lora_alpha=8),
        ("8",),
    )
    for label, value in {"-1": -1.0, "nan": math.nan}.items():
        case(
            "bayesianize",
            "lora_alpha",
            label,
            lambda F, v=value: convert(F, lora_rank=2, lora_alpha=v),
        )
    case(
        "bayesianize",
        "deterministic",
        "'no_such_layer'",
        lambda F: convert(F, deterministic=["no_such_layer"]),
        ("no_such_layer",),
    )
    case(
        "bayesianize",
        "bayesian",
        "'no_such_layer'",
        lambda F: convert(F, bayesian=["no_such_layer"]),
        ("no_such_layer",),
    )
    for label, value in {"'s'": "s", "2.5": 2.5, "-1": -1}.items():
        case("bayesianize", "seed", label, lambda F, v=value: convert(F, seed=v))
    for label, value in {"1.5": 1.5, "-0.1": -0.1, "nan": math.nan}.items():
        case(
            "bayesianize",
            "batch_norm_momentum",
            label,
            lambda F, v=value: convert(F, batch_norm_momentum=v),
        )
    case("bayesianize", "center", "'yes'", lambda F: convert(F, center="yes"))
    for label, value in {"'gaussian'": "gaussian", "-1": -1.0}.items():
        case("bayesianize", "kernel_prior", label, lambda F, v=value: convert(F, kernel_prior=v))


def _refine_cases():
    import bayes_keras as bk

    def refine(F, **kw):
        return bk.refine(
            **{
                "model": F.vi_model,
                "x": F.x,
                "y": F.y,
                "num_stages": 1,
                "steps_per_stage": 2,
                "verbose": 0,
                **kw,
            }
        )

    for label, value in {"0": 0, "-1": -1, "2.5": 2.5, "'2'": "2", "3 for 2 particles": 3}.items():
        case(
            "refine",
            "num_samples",
            label,
            lambda F, v=value: refine(F, num_samples=v),
            (label.split(" ")[0],),
        )
    for label, value in {"0": 0, "-1": -1, "2.5": 2.5}.items():
        case("refine", "num_stages", label, lambda F, v=value: refine(F, num_stages=v))
    for label, value in {"0": 0.0, "1.5": 1.5, "nan": math.nan}.items():
        case(
            "refine",
            "variance_ratio",
            label,
            lambda F, v=value: refine(F, variance_ratio=v, num_stages=2),
        )
    for label, value in {"2.5": 2.5, "-1": -1}.items():
        case("refine", "steps_per_stage", label, lambda F, v=value: refine(F, steps_per_stage=v))
    for label, value in {"-1": -1.0, "nan": math.nan, "0": 0.0}.items():
        case("refine", "learning_rate", label, lambda F, v=value: refine(F, learning_rate=v))
    for label, value in {"0": 0, "-2": -2}.items():
        case("refine", "batch_size", label, lambda F, v=value: refine(F, batch_size=v))
    case("refine", "variances", "[0.7, 0.6]", lambda F: refine(F, variances=[0.7, 0.6]), ("1.3",))
    case("refine", "variances", "[-0.1]", lambda F: refine(F, variances=[-0.1]))
    case("refine", "x", "5 features", lambda F: refine(F, x=F.x5), ("(32, 5)",))
    case("refine", "y", "10 labels for 32 rows", lambda F: refine(F, y=F.y[:10]), ("10",))
    case("refine", "sample_weight", "-1", lambda F: refine(F, sample_weight=-F.ones))
    case(
        "refine",
        "model",
        "a GPF model",
        lambda F: refine(F, model=F.model),
        ("GaussianParticleFlow",),
    )
    case("refine", "verbose", "'loud'", lambda F: refine(F, verbose="loud"))


def _metric_cases():
    import numpy as np

    import bayes_keras as bk

    for name in ("accuracy", "nll", "brier", "ece", "calibration_curve", "evaluate_probs"):

        def call(F, name=name, **kw):
            return getattr(bk.metrics, name)(**{"probs": F.probs, "labels": F.y, **kw})

        api = f"metrics.{name}"
        case(api, "probs", "1.5", lambda F, c=call: c(F, probs=F.probs_high))
        case(api, "probs", "-0.1", lambda F, c=call: c(F, probs=F.probs_low))
        case(
            api, "probs", "rows summing to 0.5", lambda F, c=call: c(F, probs=F.probs / 2), ("0.5",)
        )
        case(api, "probs", "NaN", lambda F, c=call: c(F, probs=F.probs * math.nan), ("NaN", "nan"))
        case(api, "probs", "(32, 3, 1)", lambda F, c=call: c(F, probs=F.probs[..., None]))
        case(
            api, "labels", "10 labels for 32 rows", lambda F, c=call: c(F, labels=F.y[:10]), ("10",)
        )
        case(api, "labels", "label 2.7", lambda F, c=call: c(F, labels=F.y + 0.7), FRACTIONS)
        case(api, "labels", "label 5 of 3 classes", lambda F, c=call: c(F, labels=F.y_out), ("5",))
        case(api, "labels", "0 rows", lambda F, c=call: c(F, probs=F.probs[:0], labels=F.y[:0]))
        if name in ("ece", "calibration_curve", "evaluate_probs"):
            for label, value in {
                "0": 0,
                "-1": -1,
                "2.5": 2.5,
                "10**9": 10**9,
                "'15'": "15",
                "True": True,
            }.items():
                case(
                    api,
                    "num_bins",
                    label,
                    lambda F, c=call, v=value: c(F, num_bins=v),
                    ("1000000000",) if label == "10**9" else None,
                )
    case(
        "metrics.interval_width",
        "upper",
        "below lower",
        lambda F: bk.metrics.interval_width(F.ones, -F.ones),
        ("upper",),
    )
    case(
        "metrics.interval_width",
        "lower",
        "NaN",
        lambda F: bk.metrics.interval_width(F.ones * math.nan, F.ones),
        ("NaN", "nan"),
    )
    case(
        "metrics.interval_width",
        "upper",
        "10 rows for 32",
        lambda F: bk.metrics.interval_width(-F.ones, F.ones[:10]),
        ("10",),
    )
    case(
        "metrics.interval_coverage",
        "upper",
        "below lower",
        lambda F: bk.metrics.interval_coverage(F.ones, -F.ones, F.zeros),
        ("upper",),
    )
    case(
        "metrics.interval_coverage",
        "targets",
        "10 for 32",
        lambda F: bk.metrics.interval_coverage(-F.ones, F.ones, F.zeros[:10]),
        ("10",),
    )
    case(
        "metrics.interval_coverage",
        "targets",
        "NaN",
        lambda F: bk.metrics.interval_coverage(-F.ones, F.ones, F.zeros * math.nan),
        ("NaN", "nan"),
    )
    case(
        "metrics.log_likelihood",
        "targets",
        "1 label for 32 rows",
        lambda F: bk.metrics.log_likelihood(F.predictive, F.y[:1]),
        ("(1,)",),
    )
    case(
        "metrics.log_likelihood",
        "targets",
        "zeros (32, 32)",
        lambda F: bk.metrics.log_likelihood(F.predictive, np.zeros((32, 32), "int32")),
        ("(32, 32)",),
    )
    case(
        "metrics.log_likelihood",
        "targets",
        "label 2.7",
        lambda F: bk.metrics.log_likelihood(F.predictive, F.y + 0.7),
        FRACTIONS,
    )
    case(
        "metrics.log_likelihood",
        "targets",
        "label 5 of 3",
        lambda F: bk.metrics.log_likelihood(F.predictive, F.y_out),
        ("5",),
    )
    case(
        "metrics.log_likelihood",
        "predictive",
        "an array",
        lambda F: bk.metrics.log_likelihood(F.probs, F.y),
        ("ndarray",),
    )
    case(
        "metrics.auroc",
        "scores_negative",
        "empty",
        lambda F: bk.metrics.auroc(F.ones[:0], F.ones),
        ("empty", "0"),
    )
    case(
        "metrics.auroc",
        "scores_positive",
        "NaN",
        lambda F: bk.metrics.auroc(F.ones, F.ones * math.nan),
        ("NaN", "nan"),
    )
    case(
        "metrics.auroc",
        "scores_positive",
        "strings",
        lambda F: bk.metrics.auroc(F.ones, F.strings[:, 0]),
        ("str", "string", "<U"),
    )
    case(
        "metrics.rmse",
        "targets",
        "10 for 32",
        lambda F: bk.metrics.rmse(F.zeros, F.zeros[:10]),
        ("10",),
    )
    case(
        "metrics.rmse",
        "mean",
        "NaN",
        lambda F: bk.metrics.rmse(F.zeros * math.nan, F.zeros),
        ("NaN", "nan"),
    )
    case(
        "metrics.ood_auroc",
        "x_out",
        "5 features",
        lambda F: bk.metrics.ood_auroc(F.model, F.x, F.x5),
        ("(32, 5)",),
    )
    case(
        "metrics.ood_auroc",
        "x_in",
        "0 rows",
        lambda F: bk.metrics.ood_auroc(F.model, F.x[:0], F.x),
        ("0 rows",),
    )
    case(
        "metrics.ood_auroc",
        "batch_size",
        "0",
        lambda F: bk.metrics.ood_auroc(F.model, F.x, F.x, batch_size=0),
    )


def _dataset_cases():
    import bayes_keras as bk

    loaders = {
        "load_digits": bk.datasets.load_digits,
        "load_breast_cancer": bk.datasets.load_breast_cancer,
        "load_diabetes": bk.datasets.load_diabetes,
        "load_mroz": bk.datasets.load_mroz,
        "load_digit_tokens": bk.datasets.load_digit_tokens,
    }
    for name, load in loaders.items():
        zero = (
            {} if name in ("load_breast_cancer", "load_mroz") else {"0": 0.0}
        )  # 0: the whole set for training
        for label, value in {
            **zero,
            "1": 1.0,
            "-0.1": -0.1,
            "1.5": 1.5,
            "nan": math.nan,
            "'0.25'": "0.25",
        }.items():
            case(
                f"datasets.{name}",
                "test_fraction",
                label,
                lambda F, f=load, v=value: f(test_fraction=v),
            )
        for label, value in {"'s'": "s", "2.5": 2.5, "-1": -1}.items():
            case(f"datasets.{name}", "seed", label, lambda F, f=load, v=value: f(seed=v))
    case("datasets.load_digits", "image", "'yes'", lambda F: bk.datasets.load_digits(image="yes"))
    case(
        "datasets.load_digit_tokens",
        "threshold",
        "-1",
        lambda F: bk.datasets.load_digit_tokens(threshold=-1),
    )
    case(
        "datasets.load_digit_tokens",
        "threshold",
        "17",
        lambda F: bk.datasets.load_digit_tokens(threshold=17),
    )
    case(
        "datasets.load_tfds",
        "name",
        "'no_such_dataset'",
        lambda F: bk.datasets.load_tfds("no_such_dataset", download=False),
        ("no_such_dataset",),
    )
    case(
        "datasets.load_tfds", "timeout", "-1", lambda F: bk.datasets.load_tfds("mnist", timeout=-1)
    )


def _file_cases():
    import bayes_keras as bk

    def path(F, name):
        return os.path.join(F.tmp, name)

    case("save", "filepath", "'m' (no .keras)", lambda F: F.model.save(path(F, "m")), ("m'",))
    case(
        "save",
        "filepath",
        "a directory",
        lambda F: F.model.save(F.user_dir(".keras")),
        ("directory",),
    )
    case("save", "filepath", "3", lambda F: F.model.save(3))
    case(
        "save",
        "filepath",
        "in a missing directory",
        lambda F: F.model.save(path(F, "missing/m.keras")),
        ("missing",),
    )
    case(
        "save",
        "overwrite",
        "False over a file",
        lambda F: F.model.save(F.saved(), overwrite=False),
        ("overwrite",),
    )
    case("save", "overwrite", "'yes'", lambda F: F.model.save(path(F, "o.keras"), overwrite="yes"))
    case(
        "load_model",
        "filepath",
        "truncated",
        lambda F: bk.load_model(F.truncated()),
        ("truncated", "zip"),
    )
    case(
        "load_model",
        "filepath",
        "not a zip",
        lambda F: bk.load_model(F.text_file(".keras")),
        ("zip",),
    )
    case(
        "load_model",
        "filepath",
        "missing",
        lambda F: bk.load_model(path(F, "missing.keras")),
        ("missing",),
    )
    case(
        "load_model",
        "filepath",
        "a directory",
        lambda F: bk.load_model(F.user_dir(".keras")),
        ("directory",),
    )
    case(
        "load_model",
        "filepath",
        "config.json of 100 MB",
        lambda F: bk.load_model(F.padded()),
        ("config.json",),
    )
    case("load_model", "filepath", "3", lambda F: bk.load_model(3))
    case(
        "export",
        "filepath",
        "a user's directory",
        lambda F: F.model.export(F.user_dir("")),
        ("notes.txt",),
    )
    case("export", "filepath", "a file", lambda F: F.model.export(F.text_file("")), ("file",))
    case("export", "filepath", "3", lambda F: F.model.export(3))
    case("export", "format", "'onnx'", lambda F: F.model.export(path(F, "e"), format="onnx"))
    case(
        "export",
        "input_signature",
        "'x'",
        lambda F: F.model.export(path(F, "e2"), input_signature="x"),
    )
    case(
        "save_adapters",
        "filepath",
        "'a' (no .weights.h5)",
        lambda F: bk.save_adapters(F.lora_model, path(F, "a")),
        ("a'",),
    )
    case("save_adapters", "model", "'m'", lambda F: bk.save_adapters("m", path(F, "b.npz")))
    case(
        "load_adapters",
        "filepath",
        "missing",
        lambda F: bk.load_adapters(F.lora_model, path(F, "missing.weights.h5")),
        ("missing",),
    )
    case(
        "load_adapters",
        "filepath",
        "a model's weights",
        lambda F: bk.load_adapters(F.lora_model, F.model_weights()),
        ("adapter",),
    )


for _build in (
    _prediction_cases,
    _fit_cases,
    _evaluate_cases,
    _bayesianize_cases,
    _refine_cases,
    _metric_cases,
    _dataset_cases,
    _file_cases,
):
    _build()


class Fixtures:
    """What the cases call on, built once per worker."""

    def __init__(self):
        import keras
        import numpy as np
        import tensorflow as tf

        import bayes_keras as bk

        self.np, self.tf, self.keras, self.bk = np, tf, keras, bk
        keras.utils.set_random_seed(0)
        rng = np.random.default_rng(0)
        self.tmp = tempfile.mkdtemp(prefix="call_sweep_")
        atexit.register(shutil.rmtree, self.tmp, True)
        self.x = rng.normal(size=(32, 4)).astype("float32")
        self.x5 = rng.normal(size=(32, 5)).astype("float32")
        self.y = rng.integers(0, 3, 32).astype("int32")
        self.y_out = self.y.copy()
        self.y_out[3] = 5
        self.ones = np.ones(32, "float32")
        self.zeros = np.zeros(32, "float32")
        self.strings = np.full((32, 4), "a")
        self.x_nan = self.x.copy()
        self.x_nan[2, 1] = np.nan
        self.x_inf = self.x.copy()
        self.x_inf[5, 0] = np.inf
        self.model = self._classifier(bk.optimizers.GaussianParticleFlow())
        self.vi_model = self._classifier(bk.optimizers.MGVBP(structure="diagonal"))
        self.predictive = self.model.predictive(self.x)
        self.probs = np.asarray(self.model.predict(self.x, verbose=0))
        self.probs_high, self.probs_low = self.probs.copy(), self.probs.copy()
        self.probs_high[0, 0], self.probs_low[0, 0] = 1.5, -0.1
        lora = bk.bayesianize(self.keras_model(), num_particles=2, lora_rank=2)
        lora.compile(optimizer=bk.optimizers.GaussianParticleFlow())
        self.lora_model = lora
        self._count = 0

    def _classifier(self, optimizer):
        keras, bk = self.keras, self.bk
        inputs = keras.Input((4,))
        hidden = bk.layers.Dense(8, activation="relu", num_particles=2)(inputs)
        model = bk.BayesianModel(inputs, bk.layers.Dense(3)(hidden), likelihood="categorical")
        model.compile(optimizer=optimizer)
        model.fit(self.x, self.y, epochs=1, verbose=0)
        return model

    def keras_model(self):
        keras = self.keras
        return keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(3, activation="softmax"),
            ]
        )

    def unbuilt(self):
        return self.keras.Sequential([self.keras.layers.Dense(3)])

    def _fresh(self, suffix):
        self._count += 1
        return os.path.join(self.tmp, f"f{self._count}{suffix}")

    def infinite(self):
        return self.tf.data.Dataset.from_tensor_slices((self.x, self.y)).batch(8).repeat()

    def infinite_x(self):
        return self.tf.data.Dataset.from_tensor_slices(self.x).batch(8).repeat()

    def dataset5(self):
        return self.tf.data.Dataset.from_tensor_slices(self.x5).batch(8)

    def weighted(self, weight):
        return self.tf.data.Dataset.from_tensor_slices((self.x, self.y, self.ones * weight)).batch(
            8
        )

    def generator(self, labels=False):
        """A finite generator of 4 batches (Keras cannot know its length)."""
        return (((self.x[:8], self.y[:8]) if labels else (self.x[:8],)) for _ in range(4))

    def user_dir(self, suffix):
        directory = self._fresh(suffix)
        os.makedirs(directory)
        with open(os.path.join(directory, "notes.txt"), "w") as f:
            f.write("the user's")
        return directory

    def text_file(self, suffix):
        path = self._fresh(suffix)
        with open(path, "w") as f:
            f.write("not a model")
        return path

    def saved(self):
        path = self._fresh(".keras")
        self.model.save(path)
        return path

    def truncated(self):
        path = self.saved()
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
        return path

    def padded(self):
        source, path = self.saved(), self._fresh(".keras")
        with (
            zipfile.ZipFile(source) as zin,
            zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout,
        ):
            for item in zin.infolist():
                data = zin.read(item.filename)
                if item.filename == "config.json":
                    data = data + b" " * (100 * 2**20)
                zout.writestr(item, data, compress_type=zipfile.ZIP_DEFLATED)
        return path

    def model_weights(self):
        path = self._fresh(".weights.h5")
        self.model.save_weights(path)
        return path


def _has_nan(result):
    import numpy as np
    import tensorflow as tf

    for leaf in tf.nest.flatten(result):
        try:
            array = np.asarray(leaf, dtype=np.float64)
        except (TypeError, ValueError):
            continue
        if array.size and not np.all(np.isfinite(array)):
            return True
    return False


def _names(message, arguments, tokens):
    arguments = arguments if isinstance(arguments, tuple) else (arguments,)
    message = message.lower()  # "NaN" / "nan", "Labels" / "labels"
    return any(
        a.lower() in message or a.lower().replace("_", " ") in message for a in arguments
    ) and any(t.lower() in message for t in tokens)


def outcome(F, call, arguments, tokens):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = call(F)
        except Exception as error:  # noqa: BLE001 (what the sweep looks for)
            kind = type(error).__name__
            if kind not in CLEAR_ERRORS:
                return f"obscure ({kind}: {str(error)[:100]})"
            return (
                "clear"
                if _names(str(error), arguments, tokens)
                else f"unclear ({kind}: {str(error)[:160]})"
            )
    said = [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]
    if any(_names(m, arguments, tokens) for m in said):
        return "clear (warned)"
    if said:
        return f"unclear (warned: {said[0][:160]})"
    return "silent NaN" if _has_nan(result) else "silent"


def worker(start):
    report = os.fdopen(
        os.dup(1), "w", buffering=1
    )  # the results; what the cases print goes to /dev/null
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.stdout = open(os.devnull, "w")
    F = Fixtures()
    for i in range(start, len(CASES)):
        api, arguments, label, call, tokens = CASES[i]
        print(json.dumps({"start": i}), file=report, flush=True)
        t = time.time()
        result = outcome(F, call, arguments, tokens)
        print(
            json.dumps({"case": i, "outcome": result, "seconds": round(time.time() - t, 2)}),
            file=report,
            flush=True,
        )


def _lines(stream, queue):
    for line in stream:
        queue.put(line)
    queue.put(None)


def run(timeout=TIMEOUT_S):
    """Run every case in worker subprocesses; a case still running after `timeout` seconds is a "hang"."""
    results, start = {}, 0
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    while start < len(CASES):
        child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", str(start)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        lines = queue.Queue()
        threading.Thread(target=_lines, args=(child.stdout, lines), daemon=True).start()
        current, wait = None, 600  # the fixtures' build
        try:
            while start < len(CASES):
                try:
                    line = lines.get(timeout=wait)
                except queue.Empty:
                    if current is None:
                        raise RuntimeError("the sweep's worker did not start") from None
                    results[current] = {"outcome": "hang", "seconds": timeout}
                    start = current + 1
                    break
                if line is None:  # the worker died (a crash in a case)
                    if current is None:
                        raise RuntimeError("the sweep's worker died outside a case")
                    results[current] = {"outcome": "obscure (the process died)", "seconds": None}
                    start = current + 1
                    break
                message = json.loads(line)
                if "start" in message:
                    current, wait = message["start"], timeout
                else:
                    results[message["case"]] = {
                        "outcome": message["outcome"],
                        "seconds": message["seconds"],
                    }
                    current, start = None, message["case"] + 1
        finally:
            if start >= len(CASES):  # done: let the worker exit (and remove its files)
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
            if child.poll() is None:
                child.kill()
            child.wait()
    return [
        dict(
            zip(
                ("api", "argument", "value"),
                (api, arguments if isinstance(arguments, str) else arguments[0], label),
            ),
            **results[i],
        )
        for i, (api, arguments, label, _, _) in enumerate(CASES)
    ]


KINDS = ("clear", "unclear", "obscure", "silent", "hang")


def main():
    rows = run()
    by_api = collections.defaultdict(collections.Counter)
    for r in rows:
        by_api[r["api"]][r["outcome"].split(" ")[0]] += 1
    total = collections.Counter(r["outcome"].split(" ")[0] for r in rows)
    lines = [
        "# Call-level bad-input sweep (benchmarks/call_sweep.py)",
        "",
        f"{len(rows)} cases, each under a {TIMEOUT_S} s timeout in a worker subprocess. "
        + "; ".join(f"{k}: {total[k]}" for k in KINDS)
        + ".",
        "",
        "| call | cases | " + " | ".join(KINDS) + " |",
        "|---|---|" + "---|" * len(KINDS),
    ]
    for name in sorted(by_api):
        c = by_api[name]
        lines.append(
            f"| {name} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in KINDS) + " |"
        )
    defects = [r for r in rows if not r["outcome"].startswith("clear")]
    if defects:
        lines += ["", "Not clear:", ""] + [
            f"- {r['api']}({r['argument']}={r['value']}): {r['outcome']}" for r in defects
        ]
    import harness  # noqa: E402 (only for writing results)

    harness.save_results("call_sweep", {"rows": rows, "machine": harness.machine_info()}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]))
    else:
        main()
