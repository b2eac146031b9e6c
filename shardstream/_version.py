"""The package's version, in a module of its own.

It imports nothing, so a module anywhere in the package (the CLI's ``--version``, the
``writer`` a manifest records) reads it without importing the package root, and
``pyproject.toml`` reads it too (``[tool.setuptools.dynamic]``): one place to bump.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
