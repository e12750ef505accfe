"""Datasets: offline real data shipped with scikit-learn (the default) and tensorflow-datasets loaders.

Every loader returns numpy arrays ((x_train, y_train), (x_test, y_test)) with a fixed, seeded split.
"""

import os

import numpy as np

from bayes_keras._config import is_real

_DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
MROZ_COVARIATES = ("nwifeinc", "educ", "exper", "expersq", "age", "kidslt6", "kidsge6")


def _check_fraction(test_fraction, allow_zero=True):
    if not is_real(test_fraction) or not (
        0 <= test_fraction < 1 if allow_zero else 0 < test_fraction < 1
    ):
        interval = "[0, 1)" if allow_zero else "(0, 1) (this loader holds out a test split)"
        raise ValueError(
            f"test_fraction must be a number in {interval} (the share of examples held out); got "
            f"{test_fraction!r}."
        )


def _check_arguments(seed, **flags):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32); got {seed!r}.")
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False; got {value!r}.")


def _split(x, y, test_fraction, seed, stratify=True):
    from sklearn.model_selection import train_test_split

    _check_fraction(test_fraction, allow_zero=False)
    _check_arguments(seed)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y if stratify else None
    )
    return (x_tr, y_tr), (x_te, y_te)


def load_digits(test_fraction=0.25, seed=0, image=True):
    """scikit-learn's 8x8 handwritten digits (1,797 images, 10 classes), pixels scaled to [0, 1].

    Args:
        image: True -> x of shape (n, 8, 8, 1) for convnets; False -> (n, 64).
    """
    from sklearn.datasets import load_digits as _load

    _check_arguments(seed, image=image)

    d = _load()
    x = (d.images / 16.0).astype(np.float32)
    x = x[..., None] if image else x.reshape(len(x), -1)
    return _split(x, d.target.astype(np.int32), test_fraction, seed)


DIGIT_TOKENS = 256  # row shapes: 8 binarised pixels as token ids 1..256; id 0 is padding


def load_digit_tokens(test_fraction=0.25, seed=0, threshold=6):
    """scikit-learn's digits as short token sequences, a small offline text-style task: each image row
    becomes a "word", its 8 pixels binarised at `threshold` (of 0..16) read as an 8-bit number, token id =
    that number + 1 (1..256, a vocabulary of row shapes); blank rows before the first and after the last
    inked row are dropped (so a sequence may be shorter than 8) and the sequences left-padded with id 0. For
    `Embedding(DIGIT_TOKENS + 1, ..., mask_zero=True)` and the recurrent layers (masked steps are skipped).
    Same split as `load_digits`.

    Returns:
        ((x_train, y_train), (x_test, y_test)), x int32 (n, 8) with 0 = padding, y int32 (n,).

    Example:
        >>> (x, y), (x_test, y_test) = bayes_keras.datasets.load_digit_tokens()
        >>> model = bayes_keras.zoo.text_rnn(bayes_keras.datasets.DIGIT_TOKENS, 10)
    """
    from sklearn.datasets import load_digits as _load

    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float, np.integer, np.floating))
        or not 0 < threshold <= 16
    ):
        raise ValueError(
            f"load_digit_tokens: threshold is a pixel intensity in (0, 16]; got {threshold!r}."
        )
    d = _load()
    bits = (d.images >= threshold).astype(np.int32)  # (n, 8 rows, 8 pixels)
    words = bits @ (2 ** np.arange(7, -1, -1)) + 1  # (n, 8): ids 1..256, 1 = a blank row
    x = np.zeros_like(words)
    for i, row in enumerate(words):
        inked = np.flatnonzero(row > 1)
        kept = row[inked[0] : inked[-1] + 1]
        x[i, x.shape[1] - len(kept) :] = kept
    return _split(x.astype(np.int32), d.target.astype(np.int32), test_fraction, seed)


def load_breast_cancer(test_fraction=0.2, seed=0, add_bias=False):
    """scikit-learn's breast cancer data (569 x 30, binary), standardised with training statistics.

    A random `test_fraction` of the examples is held out (default 0.2, as `load_diabetes`); with
    test_fraction=0 the whole set is the training split (the full-batch posterior experiments) and the
    test split is empty.
    `add_bias` appends a constant-1 column (for Bayesian logistic regression with a bias weight).
    """
    from sklearn.datasets import load_breast_cancer as _load

    _check_arguments(seed, add_bias=add_bias)

    d = _load()
    x, y = d.data.astype(np.float64), d.target.astype(np.int32)
    _check_fraction(test_fraction)
    if test_fraction > 0:
        (x_tr, y_tr), (x_te, y_te) = _split(x, y, test_fraction, seed)
    else:
        (x_tr, y_tr), (x_te, y_te) = (x, y), (x[:0], y[:0])
    mu, sd = x_tr.mean(0), x_tr.std(0)
    x_tr, x_te = (x_tr - mu) / sd, (x_te - mu) / sd
    if add_bias:
        x_tr = np.concatenate([x_tr, np.ones((len(x_tr), 1))], 1)
        x_te = np.concatenate([x_te, np.ones((len(x_te), 1))], 1)
    return (x_tr.astype(np.float32), y_tr), (x_te.astype(np.float32), y_te)


def load_mroz(test_fraction=0.25, seed=0, add_bias=False, standardize=True):
    """Mroz's labour force participation data (753 married women, 1975; binary: in the labour force), the
    seven covariates of the standard logit (Wooldridge, "Introductory Econometrics", Example 17.1; the
    labour data of Magris, Shabani & Iosifidis 2022, "Manifold Gaussian Variational Bayes on the Precision
    Matrix", https://arxiv.org/abs/2210.14598): `MROZ_COVARIATES` = non-wife income (1,000 USD), years of
    education, years of experience and its square, age, children under 6, children 6-18.

    Shipped with the package (bayes_keras/data/mroz.csv, those columns only; source and licence in
    bayes_keras/data/mroz_SOURCE.md). A stratified `test_fraction` is held out (default 0.25, the paper's
    75/25 split); test_fraction=0 gives all 753 rows as the training split (the full-batch posterior
    experiments). With `standardize` (default) covariates are standardised with the training statistics,
    which makes a N(0, s^2 I) prior treat them alike; False keeps their own units (the textbook's
    coefficients). `add_bias` appends a constant-1 column (the intercept).

    Returns:
        ((x_train, y_train), (x_test, y_test)), x float32 (n, 7) or (n, 8) with add_bias, y int32 (n,).

    Example:
        >>> (x, y), _ = bayes_keras.datasets.load_mroz(test_fraction=0, add_bias=True)   # (753, 8)
    """
    table = np.loadtxt(os.path.join(_DATA_DIR, "mroz.csv"), delimiter=",", skiprows=1)
    x, y = table[:, 1:], table[:, 0].astype(np.int32)
    _check_arguments(seed, add_bias=add_bias, standardize=standardize)
    _check_fraction(test_fraction)
    if test_fraction > 0:
        (x_tr, y_tr), (x_te, y_te) = _split(x, y, test_fraction, seed)
    else:
        (x_tr, y_tr), (x_te, y_te) = (x, y), (x[:0], y[:0])
    if standardize:
        mu, sd = x_tr.mean(0), x_tr.std(0)
        x_tr, x_te = (x_tr - mu) / sd, (x_te - mu) / sd
    if add_bias:
        x_tr = np.concatenate([x_tr, np.ones((len(x_tr), 1))], 1)
        x_te = np.concatenate([x_te, np.ones((len(x_te), 1))], 1)
    return (x_tr.astype(np.float32), y_tr), (x_te.astype(np.float32), y_te)


def load_diabetes(test_fraction=0.2, seed=0):
    """scikit-learn's diabetes regression data (442 x 10; target: disease progression after one year,
    25-346, sd 77), inputs standardised with training statistics, targets left in their own units (a
    Normal likelihood standardises them itself).
    """
    from sklearn.datasets import load_diabetes as _load

    d = _load()
    (x_tr, y_tr), (x_te, y_te) = _split(
        d.data.astype(np.float64), d.target.astype(np.float32), test_fraction, seed, stratify=False
    )
    mu, sd = x_tr.mean(0), x_tr.std(0)
    return (((x_tr - mu) / sd).astype(np.float32), y_tr), (
        ((x_te - mu) / sd).astype(np.float32),
        y_te,
    )


def load_tfds(
    name, split=("train", "test"), image_scale=255.0, data_dir=None, download=True, timeout=5.0
):
    """Load a tensorflow-datasets image classification set (mnist, fashion_mnist, cifar10, ...) as numpy
    arrays, one (x, y) pair per split; pixels scaled by 1 / image_scale.

    The first call downloads and prepares the data in `data_dir` (tfds' default ~/tensorflow_datasets);
    later calls read it there. Without prepared data and without a network (checked once, within
    `timeout` seconds) a ConnectionError says so at once, instead of tfds' minutes of retries.

    Example:
        >>> (x_train, y_train), (x_test, y_test) = bayes_keras.datasets.load_tfds("fashion_mnist")
    """
    import tensorflow_datasets as tfds

    if not isinstance(name, str) or not name:
        raise ValueError(
            f"load_tfds: name must be a tensorflow-datasets name such as 'mnist'; got {name!r}."
        )
    for argument, value in (("timeout", timeout), ("image_scale", image_scale)):
        if not is_real(value) or not 0 < value < float("inf"):
            raise ValueError(f"load_tfds: {argument} must be a positive number; got {value!r}.")
    _check_arguments(0, download=download)
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(
            f"load_tfds: name {name!r} is not a tensorflow-datasets dataset (e.g. 'mnist', "
            "'fashion_mnist', 'cifar10')."
        ) from None
    if not builder.is_prepared():
        where = data_dir or "tfds' default data_dir (~/tensorflow_datasets)"
        if not download:
            raise FileNotFoundError(
                f"tensorflow-datasets '{name}' is not prepared in {where}, and download=False."
            )
        if not download_server_reachable(timeout):
            raise ConnectionError(
                f"tensorflow-datasets '{name}' is not prepared in {where} and the download server cannot be reached "
                f"(no network within {timeout:g} s). Prepare it on a machine with a network and pass data_dir=, or "
                "use the offline data: load_digits, load_breast_cancer, load_diabetes."
            )
        builder.download_and_prepare()
    out = []
    for s in split:
        xs, ys = [], []
        for x, y in tfds.as_numpy(builder.as_dataset(split=s, as_supervised=True).batch(4096)):
            xs.append(x)
            ys.append(y)
        out.append(
            (
                np.concatenate(xs).astype(np.float32) / image_scale,
                np.concatenate(ys).astype(np.int32),
            )
        )
    return tuple(out)


def download_server_reachable(timeout=5.0, host="storage.googleapis.com", port=443):
    """Whether tensorflow-datasets' download server answers within `timeout` seconds."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
