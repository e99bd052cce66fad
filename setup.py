"""For tools that still run `setup.py`: the package is defined in pyproject.toml, which setuptools reads."""

from setuptools import setup

setup()
