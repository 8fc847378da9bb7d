"""``[maintenance]`` (with ``[reconciler]``, its older spelling) and ``[retention]``: the services that
repair and prune the ledger, and how long it keeps what.
"""

from __future__ import annotations

from collections.abc import Mapping

from effectgate.ledger.maintenance import rescuer as rescuer_defaults
from effectgate.ledger.maintenance import waker as waker_defaults
from effectgate.ledger.maintenance.partitions import DEFAULT_INTERVAL as DEFAULT_PARTITION_INTERVAL
from effectgate.ledger.maintenance.partitions import DEFAULT_PREMAKE, PartitionConfig
from effectgate.ledger.maintenance.rescuer import RescuerConfig
from effectgate.ledger.maintenance.retention import DEFAULT_BATCH as DEFAULT_RETENTION_BATCH
from effectgate.ledger.maintenance.retention import DEFAULT_HISTORY, DEFAULT_PAYLOADS, RetentionConfig
from effectgate.ledger.maintenance.scheduler import (
    DEFAULT_PENDING_TTL,
    DEFAULT_POISON_THRESHOLD,
    DEFAULT_TICK,
    ReconcilerConfig,
)
from effectgate.ledger.maintenance.sweeps import SweepConfig
from effectgate.ledger.maintenance.waker import WakerConfig

from .providers import DAY, HOUR, RETRY_WINDOWS, retry_window
from .reader import ConfigError as ConfigError
from .reader import TableReader
from .sources import Source


def read_maintenance(root: TableReader) -> ReconcilerConfig:
    """``[maintenance]`` and its services' sections; ``[reconciler]`` is the older flat spelling, kept."""
    legacy = root.table_of("reconciler")
    mt = root.table_of("maintenance")
    if legacy.table and mt.table:
        root.problem("reconciler", "is the older name of [maintenance]; use one of them, not both")
    if legacy.table:
        try:
            config = ReconcilerConfig(
                tick=legacy.number("tick", DEFAULT_TICK, minimum=0.001),
                pending_ttl=legacy.number("pending_ttl", DEFAULT_PENDING_TTL, minimum=0.001),
                poison_threshold=legacy.number(
                    "poison_threshold", DEFAULT_POISON_THRESHOLD, minimum=1, integer=True
                ),
                signature_failure_retention=86400.0
                * legacy.number("signature_failure_retention_days", 30, minimum=0.001),
            )
        except ValueError as exc:
            legacy.problem("tick", str(exc))
            config = ReconcilerConfig()
        legacy.no_unknown_keys()
        return config
    tick = mt.number("tick", DEFAULT_TICK, minimum=0.001)
    lr = mt.table_of("lease_rescuer")
    pw = mt.table_of("pending_waker")
    sw = mt.table_of("sweeps")
    pt = mt.table_of("partitions")
    try:
        rescuer = RescuerConfig(
            batch=lr.number("batch", rescuer_defaults.DEFAULT_BATCH, minimum=1, integer=True),
            poison_threshold=lr.number("poison_threshold", DEFAULT_POISON_THRESHOLD, minimum=1, integer=True),
        )
        waker = WakerConfig(
            pending_ttl=pw.number("pending_ttl", DEFAULT_PENDING_TTL, minimum=0.001),
            batch=pw.number("batch", waker_defaults.DEFAULT_BATCH, minimum=1, integer=True),
        )
    except ValueError as exc:  # the readers' minimums catch what the dataclasses would refuse
        mt.problem("lease_rescuer", str(exc))
        rescuer, waker = RescuerConfig(), WakerConfig()
    sweeps = SweepConfig(enabled=sw.get("enabled", bool, True))
    partitions = PartitionConfig(
        interval=HOUR * pt.number("interval_hours", DEFAULT_PARTITION_INTERVAL / HOUR, minimum=1 / 60),
        premake=pt.number("premake", DEFAULT_PREMAKE, minimum=1, integer=True),
    )
    for reader in (lr, pw, sw, pt):
        reader.no_unknown_keys()
    mt.no_unknown_keys()
    return ReconcilerConfig(
        tick=tick,
        poison_threshold=rescuer.poison_threshold,
        pending_ttl=waker.pending_ttl,
        rescuer=rescuer,
        waker=waker,
        sweeps=sweeps,
        partitions=partitions,
    )


def read_retention(
    root: TableReader, sources: Mapping[str, Source], legacy_signature_failures: float
) -> RetentionConfig:
    """``[retention]`` and ``[retention.sources.NAME]``; windows in days (fractions allowed)."""
    rt = root.table_of("retention")

    def days(reader: TableReader, key: str, default: float | None) -> float | None:
        value = reader.get(key, (int, float, str), None)
        if value is None:
            return default
        if value == "forever":
            if key != "tombstones_days":
                reader.problem(key, 'only tombstones_days may be "forever"')
                return default
            return None
        if isinstance(value, str) or not value > 0:
            reader.problem(key, f"must be a number of days > 0, got {value!r}")
            return default
        return float(value) * DAY

    payloads = days(rt, "payloads_days", DEFAULT_PAYLOADS)
    history = days(rt, "history_days", DEFAULT_HISTORY)
    tombstones = days(rt, "tombstones_days", None)
    signature_failures = days(rt, "signature_failures_days", legacy_signature_failures)
    batch = rt.number("batch", DEFAULT_RETENTION_BATCH, minimum=1, integer=True)
    per = rt.table_of("sources")
    source_payloads: dict[str, float] = {}
    source_tombstones: dict[str, float | None] = {}
    provider_floor: dict[str, float] = {}
    for name in per.table:
        if name not in sources:
            per.problem(name, f"is not a configured source (known: {', '.join(sorted(sources))})")
            per.used.add(name)
            continue
        one = per.table_of(name)
        if "payloads_days" in one.table:
            source_payloads[name] = days(one, "payloads_days", None) or 0.0
        if "tombstones_days" in one.table:
            source_tombstones[name] = days(one, "tombstones_days", None)
        floor = one.get("provider_retry_hours", (int, float))
        if floor is not None:
            if floor < 0:
                one.problem("provider_retry_hours", f"must be >= 0, got {floor!r}")
            else:
                provider_floor[name] = float(floor) * HOUR
        one.no_unknown_keys()
    rt.no_unknown_keys()
    assert payloads is not None and history is not None and signature_failures is not None
    try:
        config = RetentionConfig(
            payloads=payloads,
            history=history,
            tombstones=tombstones,
            signature_failures=signature_failures,
            batch=batch,
            source_payloads=source_payloads,
            source_tombstones=source_tombstones,
        )
    except ValueError as exc:
        rt.problem("payloads_days", str(exc))
        return RetentionConfig()
    # The dedupe window may never be shorter than the provider's own retries: a late retry would be new.
    for name, source in sources.items():
        window = config.dedupe_window(name)
        if window is None:
            continue
        floor = provider_floor.get(name, retry_window(source.scheme_name))
        if window < floor:
            where = per.table_of(name) if name in source_tombstones else rt
            basis = RETRY_WINDOWS.get(source.scheme_name)
            because = basis.basis if basis is not None and name not in provider_floor else "as configured"
            where.problem(
                "tombstones_days",
                f"{window / DAY:g} days is shorter than source {name!r} ({source.scheme_name}) retries: "
                f"{floor / DAY:g} days ({because}); a late retry would run its effect again. "
                "See docs/providers.md",
            )
    return config
