"""Example handlers: keep an audit record of every GitHub and Standard Webhooks event, once each, and of
every merged pull request.

GitHub signs the body only: the delivery id and the event name are unsigned headers. The default key is
built from the signed body, so a captured delivery replayed under a new ``X-GitHub-Delivery`` is a
duplicate; and the merge record asks the signed body (``require``) whether the pull request merged, since
any closed issue's body could be resent as ``X-GitHub-Event: pull_request``.
"""

from __future__ import annotations

from typing import Any

from effectgate.handlers import EffectContext, Event, effect


async def _audit(ctx: EffectContext, ev: Event) -> None:
    async def record(_key: str) -> dict[str, Any]:
        return {"source": ev.source, "event_id": ev.id, "type": ev.type}

    await ctx.step("audit", record)


for _source in ("github", "standard"):
    effect(source=_source, events=["*"], name=f"audit.{_source}", orphan_policy="redrive")(_audit)


@effect(
    source="github",
    events=["pull_request.closed"],
    key=lambda ev: f"github-merged:{ev.payload['repository']['full_name']}#{ev.payload['number']}",
    name="audit.github_merged",
    require={"/pull_request/merged": True},
    # Filed under "github:", so no other source's events can ever claim this key.
    key_space="source",
    orphan_policy="redrive",
)
async def record_merge(ctx: EffectContext, ev: Event) -> None:
    """Record a merged pull request, once per pull request."""
    pull = ev.payload["pull_request"]

    async def record(_key: str) -> dict[str, Any]:
        return {"number": ev.payload["number"], "merge_commit_sha": pull.get("merge_commit_sha")}

    await ctx.step("merged", record)
