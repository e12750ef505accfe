"""Converting Keras models: bayesianize, its conversion report and the scikit-learn wrappers.

Nothing is imported here: import the module you need.
"""
