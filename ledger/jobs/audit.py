"""The operator's record: every action an operator takes, with who, when and why (design invariant 17).

``record`` is the one function every action writes through — redrive, cancel and resolve on a job (one at a
time or in bulk: a bulk action goes through the single ones), the replay that created a job, and pause and
resume of a kind — in the caller's transaction, beside the action itself. Job actions land in ``job_actions``
and show in that job's (and its effect's) timeline; kind actions land in ``kind_actions``, one row per action
however many jobs the kind has, and a job's timeline reads those of its kind within its own lifetime
(``for_job``). ``replayed_failures`` names what a redrive would replay instead of calling the provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypedDict, cast

from psycopg.types.json import Jsonb

from ..db import Conn
from ..errors import InvalidParameter
from ..queries import Q
from ..storable import storable_json, storable_text

JobAction = Literal["redrive", "cancel", "resolve", "replay"]
KindAction = Literal["pause", "resume"]
#: How many of its kind's pauses and resumes a job's timeline shows: a kind paused and resumed every minute
#: for a month must not make one job's page a month long.
MAX_KIND_ACTIONS = 100


#: A reason longer than this is refused: it is shown on every face, and a page of text is not a reason.
MAX_REASON_LENGTH = 500


def check_note(reason: str | None) -> str | None:
    """An operator's reason, stripped (``None`` when empty), or ``InvalidParameter`` (code ``invalid_reason``)
    when it is not printable text of at most ``MAX_REASON_LENGTH`` characters.

    The one place that rule lives: every face (API, dashboard, CLI, bulk) checks a reason here, or through
    ``resolutions.check_reason`` where one is required, before the action is taken."""
    text = (reason or "").strip()
    if not text:
        return None
    if len(text) > MAX_REASON_LENGTH or not text.isprintable():
        raise InvalidParameter("reason", f"expected printable text of at most {MAX_REASON_LENGTH} characters")
    return text


class ActionRow(TypedDict):
    """One operator action as a timeline shows it: ``action`` (redrive, cancel, resolve, replay, pause,
    resume), who, why, when, and ``detail`` (what the action saw; for a kind's action, ``{"kind": …}``)."""

    action: str
    acted_by: str
    reason: str | None
    detail: dict[str, Any] | None
    acted_at: datetime


@dataclass(frozen=True, slots=True)
class ReplayedFailure:
    """A step that recorded a terminal error: a redrive's next run raises it again without calling the
    provider (``handlers.context`` replays recorded outcomes; a recorded step is never re-run)."""

    step: str
    code: str | None
    message: str | None
    recorded_at: datetime

    def describe(self) -> str:
        """``capture (card_declined: Your card was declined.)``."""
        said = ": ".join(str(p) for p in (self.code, self.message) if p)
        return f"{self.step} ({said})" if said else self.step


async def record(
    conn: Conn,
    action: JobAction | KindAction,
    *,
    by: str,
    reason: str | None = None,
    job_id: int | None = None,
    kind: str | None = None,
    tenant: str | None = None,
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> datetime | None:
    """Record one operator action: on job ``job_id`` (``tenant`` routes it on Citus) or on handler ``kind``.
    Returns when it was recorded, or ``None`` if the job does not exist. Call it in the action's transaction."""
    who = storable_text(by.strip()) or "unknown"
    why = storable_text(reason) if reason else None
    if action in ("pause", "resume"):
        if kind is None or job_id is not None:
            raise ValueError(f"a {action} is recorded on a kind")
        params: dict[str, Any] = {"kind": kind, "action": action, "by": who, "reason": why, "now": now}
        row = await (await conn.execute(Q["kind_action_record"], params)).fetchone()
    else:
        if job_id is None or kind is not None:
            raise ValueError(f"a {action} is recorded on a job")
        params = {
            "job_id": job_id,
            "tenant": tenant,
            "action": action,
            "by": who,
            "reason": why,
            "detail": Jsonb(storable_json(detail)) if detail else None,
            "now": now,
        }
        row = await (await conn.execute(Q["job_action_record"], params)).fetchone()
    return None if row is None else cast(datetime, row["acted_at"])


async def for_job(
    conn: Conn,
    job_id: int,
    *,
    kind: str,
    since: datetime,
    until: datetime | None,
    tenant: str | None = None,
) -> list[ActionRow]:
    """The actions on one job and the pauses and resumes of its ``kind`` in [since, until] (the job's
    lifetime; ``until`` ``None`` while it lives), oldest first."""
    rows = await (
        await conn.execute(Q["job_actions_for_job"], {"job_id": job_id, "tenant": tenant})
    ).fetchall()
    kinds = await (
        await conn.execute(
            Q["kind_actions_for_kind_between"],
            {"kind": kind, "since": since, "until": until, "limit": MAX_KIND_ACTIONS},
        )
    ).fetchall()
    actions = [cast(ActionRow, r) for r in rows]
    actions += [
        ActionRow(
            action=k["action"],
            acted_by=k["acted_by"],
            reason=k["reason"],
            detail={"kind": k["kind"]},
            acted_at=k["acted_at"],
        )
        for k in kinds
    ]
    return sorted(actions, key=lambda a: a["acted_at"])


async def replayed_failures(conn: Conn, job_id: int, *, tenant: str | None = None) -> list[ReplayedFailure]:
    """The steps of the job's effect that recorded a terminal error, oldest first: what a redrive replays."""
    rows = await (
        await conn.execute(Q["steps_failed_for_job"], {"job_id": job_id, "tenant": tenant})
    ).fetchall()
    failures = []
    for r in rows:
        error = r["error"] if isinstance(r["error"], dict) else {}
        code, message = error.get("code"), error.get("message")
        failures.append(
            ReplayedFailure(
                r["name"],
                code if isinstance(code, str) else None,
                message if isinstance(message, str) else None,
                r["recorded_at"],
            )
        )
    return failures
