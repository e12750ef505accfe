"""Every public optimizer, for the tests that train each one: the one place a new method is added.

`METHODS` maps each public method's name to its class (tests/optimizers/test_optimizer_registry.py checks it against
`bayes_keras.optimizers`); `configured(...)` gives {name: factory} for EVERY method, each built with the
settings a test chooses, so a test of "every optimizer" cannot leave a new one out.
"""

import bayes_keras as bk

METHODS = {
    "GaussianParticleFlow": bk.optimizers.GaussianParticleFlow,
    "IndependentParticles": bk.optimizers.IndependentParticles,
    "SVGD": bk.optimizers.SVGD,
    "MatrixSVGD": bk.optimizers.MatrixSVGD,
    "PreconditionedParticles": bk.optimizers.PreconditionedParticles,
    "MGVBP": bk.optimizers.MGVBP,
    "MeanFieldVI": bk.optimizers.MeanFieldVI,
}


def configured(**settings):
    """{method name: factory} for every method of METHODS. `settings[name]`: the keyword arguments of its
    constructor (a dict) or a factory of its own (a callable); a method not named gets its defaults."""
    unknown = sorted(set(settings) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; the registry has {sorted(METHODS)}")
    factories = {}
    for name, cls in METHODS.items():
        given = settings.get(name, {})
        factories[name] = given if callable(given) else (lambda cls=cls, kw=given: cls(**kw))
    return factories
