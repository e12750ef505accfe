"""Saving and loading: atomic files, the model's serialization, checks of loaded state, the SavedModel
export of the posterior predictive and LoRA adapters.

Nothing is imported here: import the module you need.
"""
