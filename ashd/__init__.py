"""ashd: a hosted agent orchestration service."""

__version__ = "0.1.0"
API_VERSION = "0.1.0"

__all__ = ["API_VERSION", "__version__"]
