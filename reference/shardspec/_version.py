"""The package's version: the one place it is written (the manifest's ``generator`` cites it)."""

__version__ = "0.1.0"
