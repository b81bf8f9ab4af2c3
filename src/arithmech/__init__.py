"""arithmech: find, explain and improve the parts of a language model that do arithmetic."""

__version__ = "0.1.0"

__all__ = ["__version__"]
