"""Step rules: turn a direction (per-particle pseudo-gradient) into the step that is subtracted.

optax-style pure pieces: `slots(shape)` names the state a rule needs for a variable of that shape
and `apply(direction, state, learning_rate, iteration)` returns (update, new_state), `iteration` the step
count 1, 2, ... State is a dict of tensors; the Keras optimizer stores it in optimizer variables so it is
saved with the model.

Dimension-wise rules (the GPF paper, Sec. 4.4 / App. H) keep ONE second-moment statistic per coordinate,
shared by all particles, so the step is x <- x - P * Delta with the same diagonal P for every particle:
an element-wise Adam would precondition each particle differently and break the affine flow.

Names for step_rule= arguments (the plain names are the particle methods' dimension-wise rules): "sgd",
"rmsprop" / "dimwise_rmsprop" (DimWiseRMSProp), "adam" / "dimwise_adam" (DimWiseAdam), "elementwise_adam"
(ElementwiseAdam), "signal_rmsprop" (SignalShare(DimWiseRMSProp())). One rule per file; `base.py` has
the interface and the registry, `signal.py` the signal-share functions.
"""

from bayes_keras.core.step_rules.base import StepRule, get, is_second_moment, register
from bayes_keras.core.step_rules.signal import signal_fraction, signal_share
from bayes_keras.core.step_rules.elementwise_adam import ElementwiseAdam
from bayes_keras.core.step_rules.dimwise_adam import DimWiseAdam
from bayes_keras.core.step_rules.dimwise_rmsprop import DimWiseRMSProp
from bayes_keras.core.step_rules.sgd import SGD
from bayes_keras.core.step_rules.signal_share_rule import SignalShare

__all__ = [
    "StepRule",
    "SGD",
    "DimWiseRMSProp",
    "ElementwiseAdam",
    "DimWiseAdam",
    "SignalShare",
    "get",
    "register",
    "is_second_moment",
    "signal_share",
    "signal_fraction",
]
