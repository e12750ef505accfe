"""The training machinery behind BayesianModel: the train / test / predict steps (particle_trainer),
their tf.distribute pieces (distribute, particle_parallel), the metrics the model reports, the checks of
call arguments and of memory, particle initialisation and the refresh of BatchNormalization statistics.

Nothing is imported here: import the module you need (the layers and the core import `distribute`).
"""
