"""The one place the version lives."""

__version__ = "0.1.0"
