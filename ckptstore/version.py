"""The package version (kept apart so modules can import it without importing the package)."""
__version__ = "0.1.0"
