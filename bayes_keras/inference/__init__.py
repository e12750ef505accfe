"""Method cores as pure tensor functions, and the functional door (log density + particles)."""

from bayes_keras.inference import step_rules
from bayes_keras.inference.functional import ParticleRun, run_particles
from bayes_keras.inference.gpf import gaussian_entropy, gpf_direction

__all__ = ["gpf_direction", "gaussian_entropy", "step_rules", "run_particles", "ParticleRun"]
