"""Reading a ``/metrics`` page in tests with the Prometheus client's own parser, so a page that parses
here parses for Prometheus too."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``text`` by (name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name{labels}`` in ``text``, 0 when absent (a counter not yet counted)."""
    return samples(text).get((name, frozenset(labels.items())), 0.0)


def names(text: str) -> set[str]:
    """The sample names of ``text`` (``x_total``, ``h_bucket``, …), as PromQL refers to them."""
    return {name for name, _ in samples(text)}
