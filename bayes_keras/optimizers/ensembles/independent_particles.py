"""Independent particles: N networks trained side by side (a deep ensemble on the particle machinery)."""

import keras

from bayes_keras.core.particle_optimizer import ParticleOptimizer
from bayes_keras.core.step_rules import ElementwiseAdam


@keras.saving.register_keras_serializable(package="bayes_keras")
class IndependentParticles(ParticleOptimizer):
    """Each particle follows its own gradient of -log p(w_n | D) (MAP per member) with element-wise Adam.

    This is a deep ensemble ("Simple and Scalable Predictive Uncertainty Estimation using Deep
    Ensembles", Lakshminarayanan et al., NeurIPS 2017, https://arxiv.org/abs/1612.01474) with the prior
    as weight decay (MAP instead of the paper's proper scoring rule and adversarial training), run as
    one vectorised model instead of N separate ones. The particles do not interact.

    Further arguments:

    - beta_1, beta_2, epsilon: Adam's constants.

    Args:
        learning_rate: Adam step size.

    Example:
        >>> model.compile(optimizer=bayes_keras.optimizers.IndependentParticles(1e-3))
    """

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-7, **kwargs):
        if kwargs.pop("step_rule", None) is not None:
            raise ValueError(
                "IndependentParticles steps every particle with Adam (beta_1, beta_2, epsilon); it takes no "
                "step_rule. For another rule on independent particles use "
                "PreconditionedParticles(preconditioner='identity', step_rule=...)."
            )
        super().__init__(
            learning_rate=learning_rate,
            step_rule=ElementwiseAdam(beta_1, beta_2, epsilon),
            **kwargs,
        )
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

    def direction(self, particles, grads, blocks):
        return grads

    def check_num_particles(self, num_particles):
        super().check_num_particles(num_particles)
        self.warn_if_one_particle(
            num_particles, "is one MAP fit (an ensemble of one), legitimate as a MAP baseline"
        )

    def get_config(self):
        config = super().get_config()
        config.pop("step_rule")
        config.update({"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon})
        return config
