"""ror_annotate."""
__version__ = "0.1.0"
