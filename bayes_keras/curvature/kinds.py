"""Which curvature formulas apply to a layer or a likelihood: decided by its class (subclasses included),
not by its class name, so a user's `class MyDense(bayes_keras.layers.Dense)` gets Dense's curvature."""


def layer_kind(layer):
    """"Dense", "Conv2D", "SimpleRNN", "LSTM" or "GRU" for those particle layers and their subclasses;
    otherwise the class name (which the callers report as unsupported)."""
    from bayes_keras import layers  # noqa: I001 (the layers import bayes_keras.curvature)

    for cls in (layers.Dense, layers.Conv2D, layers.SimpleRNN, layers.LSTM, layers.GRU):
        if isinstance(layer, cls):
            return cls.__name__
    return type(layer).__name__


def likelihood_kind(likelihood):
    """"Categorical", "Bernoulli" or "Normal" for those likelihoods and their subclasses; otherwise the
    class name."""
    from bayes_keras import likelihoods

    for cls in (likelihoods.Categorical, likelihoods.Bernoulli, likelihoods.Normal):
        if isinstance(likelihood, cls):
            return cls.__name__
    return type(likelihood).__name__
