"""The ledger as a scheme's ``ReplayMemory``: what PayPal's ``confirm`` step asks about transmission ids.

Schemes import nothing of the project, so the gateway lends them this adapter. It reaches the ledger only
for a delivery whose signature already verified (``Scheme.confirm`` runs after ``verify``), so an
unauthenticated sender cannot make a request wait on the claim pool through it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from effectgate.ledger import db, transmissions
from effectgate.ledger.errors import LedgerError

from ..signatures import ConfirmationUnavailable

log = logging.getLogger("effectgate.gateway")


@dataclass(frozen=True, slots=True)
class LedgerReplayMemory:
    """``ReplayMemory`` over the ``transmissions`` table, shared by every gateway replica."""

    pool: db.Pool

    async def remember_first(
        self, *, source: str, transmission_id: str, body_sha256: str, expires_at: float
    ) -> str:
        """Record ``body_sha256`` for the id unless one is recorded; the hash recorded first."""
        try:
            async with db.connection(self.pool) as conn:
                remembered = await transmissions.remember_first(
                    conn,
                    source=source,
                    transmission_id=transmission_id,
                    body_sha256=body_sha256,
                    expires_at=datetime.fromtimestamp(expires_at, UTC),
                )
        except LedgerError as exc:
            # Nothing is claimed and the answer is a 503: PayPal retries, and the retry is safe.
            log.warning("transmission.not_remembered", extra={"source": source, "error": str(exc)})
            raise ConfirmationUnavailable(
                "the ledger could not be asked whether this transmission was seen before"
            ) from exc
        return remembered.body_sha256
