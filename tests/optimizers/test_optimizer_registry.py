"""The tests' optimizer registry lists every public method of bayes_keras.optimizers."""

import inspect

import bayes_keras as bk
from optimizer_registry import METHODS, configured

# the shared contract and the bases methods derive from; GPF is GaussianParticleFlow's short name
NOT_METHODS = {"BayesianOptimizer", "ParticleOptimizer", "GaussianVariationalOptimizer", "GPF"}


def test_the_registry_lists_every_public_optimizer():
    public = {
        name
        for name in bk.optimizers.__all__
        if inspect.isclass(getattr(bk.optimizers, name))
        and issubclass(getattr(bk.optimizers, name), bk.optimizers.BayesianOptimizer)
        and name not in NOT_METHODS
    }
    assert public == set(METHODS)
    built = {name: make() for name, make in configured().items()}
    # isinstance: MGVBP(structure=...) builds the subclass of its structure
    assert all(isinstance(opt, METHODS[name]) for name, opt in built.items())
