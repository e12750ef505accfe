# Metadata lives in pyproject.toml; this shim keeps `pip install -e .` working on old pips.
from setuptools import setup

setup()
