"""Development tools shipped with ashd (not used by the running service)."""

__all__ = ["fake_model"]
