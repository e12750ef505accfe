"""GaussianFamily: the interface of one block of an explicit Gaussian posterior."""


def current(variable):
    """Read a state variable's current value (the default `read` of the families' methods)."""
    return variable.value


class GaussianFamily:
    """One block of q = N(mu, P^-1) over `dim` flattened weights, its state kept in optimizer variables.

    A family implements:
        variables(add_variable, prefix) -> {name: variable}: the block's state ("mean", "m_mean", ...),
            created through the optimizer's `add_variable(shape, name, dtype)` (saved with the model).
        initialize(state, mean): q at the start, centred at `mean` (its spread set by the constructor).
        sample(state, eps, read) -> (rows, dim): mu + P^{-1/2} eps for standard normals eps (rows, dim).
        entropy(state), distribution(state), marginal(state, offset, size): H(q), q and the marginal of
            a contiguous range of coordinates as TFP distributions.
    Families used elementwise (the diagonal ones, stepped per variable on slices of one flat block) also
    implement moments(state, read) -> (mean, standard deviation) as (D,) tensors.
    And an `update(state, ..., writes)`, whose arguments are what the method's estimator gives that
    family (natural gradients and step sizes for MGVBP's families, Euclidean gradients for
    SoftplusGaussian): deliberately not one signature, since a family's update is defined in its own
    coordinates.
    `read(variable)` gives the value a method should use: the current one, or one an update has just
    computed (StateWrites.read), so that the new particles are samples of the new q.

    Args:
        dim: number of weights in the block.
        dtype: dtype of the state ("float64" for full and Kronecker precisions; diagonal ones keep the
            weights' dtype).
    """

    def __init__(self, dim, dtype):
        self.dim = int(dim)
        self.dtype = dtype

    @staticmethod
    def momentum(state, name, natural_gradient, omega):
        """m <- omega T(m) + (1 - omega) natgrad (MGVBP's momentum): state[name] already holds T(m), since a
        family's `update` transports m when it writes it."""
        return omega * state[name].value + (1.0 - omega) * natural_gradient

    def variables(self, add_variable, prefix):
        raise NotImplementedError

    def initialize(self, state, mean):
        raise NotImplementedError

    def sample(self, state, eps, read=current):
        raise NotImplementedError

    def entropy(self, state):
        raise NotImplementedError

    def distribution(self, state):
        raise NotImplementedError

    def marginal(self, state, offset, size):
        raise NotImplementedError
