"""POST /webhooks/{source}: a delivery read, verified, planned, claimed and answered (``pipeline``); the
records a verified request becomes (``deliveries``)."""

from .pipeline import deliver, error

__all__ = ["deliver", "error"]
