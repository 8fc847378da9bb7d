"""Every report is declared once, as a spec, and every face is derived from it: these check the specs are
whole and that each face offers exactly what each spec declares."""

from __future__ import annotations

import argparse
import re

import pytest

from effectgate.gateway.operator import cli as operator_cli
from effectgate.gateway.operator import dashboard, params, reporting
from effectgate.gateway.operator.dashboard import rendering
from effectgate.gateway.operator.openapi import DOCUMENT
from effectgate.ledger.queries import Q
from effectgate.ledger.reports import REPORTS
from effectgate.ledger.reports.spec import ReportSpec, Sort, compose

SPECS = pytest.mark.parametrize("spec", REPORTS, ids=[s.name for s in REPORTS])


@SPECS
def test_a_spec_names_one_block_with_the_two_holes_and_columns_for_every_sort(spec: ReportSpec) -> None:
    block = Q[spec.query]
    assert block.count("{after}") == 1 and block.count("{order}") == 1
    assert re.findall(r"\{(\w*)\}", block) in (["after", "order"], ["order", "after"])
    if spec.summary is not None:
        assert "{" not in Q[spec.summary.query]
    assert len({s.name for s in spec.sorts}) == len(spec.sorts)
    for sort in spec.sorts:
        for field in sort.fields:
            # A sort column has a type a cursor can carry, so its position can be read back.
            assert spec.column(field).type in params.CURSOR_READERS, (spec.name, sort.name, field)
    assert {c.name for c in spec.table_columns} <= {c.name for c in spec.columns}


@SPECS
def test_order_and_keyset_are_composed_only_from_the_declared_columns(spec: ReportSpec) -> None:
    for sort in spec.sorts:
        first = compose(spec, sort, None).as_string(None)
        later = compose(spec, sort, tuple(range(len(sort.columns)))).as_string(None)
        quoted = ", ".join(".".join(f'"{p}"' for p in c.split(".")) for c in sort.columns)
        order = order_of(sort)
        assert f"ORDER BY {order}" in first
        assert first.count("TRUE") == 1 and "%(after_0)s" not in first
        placeholders = ", ".join(f"%(after_{i})s" for i in range(len(sort.columns)))
        keyset = f"({quoted}) {'<' if sort.descending else '>'} ({placeholders})"
        # A later page differs from the first in nothing but the keyset condition.
        assert later == first.replace("TRUE", keyset)
        # And one order differs from another in nothing but the ORDER BY list.
        other = compose(spec, spec.sorts[0], None).as_string(None)
        assert first.replace(order, "") == other.replace(order_of(spec.sorts[0]), "")


def order_of(sort: Sort) -> str:
    direction = " DESC" if sort.descending else ""
    return ", ".join(".".join(f'"{p}"' for p in c.split(".")) + direction for c in sort.columns)


@SPECS
def test_the_api_and_its_document_offer_exactly_the_specs_parameters(spec: ReportSpec) -> None:
    operation = DOCUMENT["paths"]["/api" + reporting.api_path(spec)]["get"]
    assert [p["name"] for p in operation["parameters"]] == list(reporting.parameters(spec))
    sort = next((p for p in operation["parameters"] if p["name"] == "sort"), None)
    if sort is not None:
        assert sort["schema"]["enum"] == [s.name for s in spec.sorts]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    report = DOCUMENT["components"]["schemas"][schema.rsplit("/", 1)[1]]
    row = DOCUMENT["components"]["schemas"][
        report["properties"][spec.items_key]["items"]["$ref"].rsplit("/", 1)[1]
    ]
    assert list(row["properties"]) == [c.name for c in spec.columns]


@SPECS
def test_the_cli_has_a_command_with_a_flag_for_every_parameter(spec: ReportSpec) -> None:
    def no_ledger(_command: object) -> None:
        raise AssertionError("parsing flags must not reach the ledger")

    parser = argparse.ArgumentParser()
    operator_cli.register(parser.add_subparsers(), no_ledger)
    args = parser.parse_args(
        ["ledger", reporting.slug(spec)]
        + [a for name in reporting.parameters(spec) for a in ("--" + name.replace("_", "-"), "x")]
    )
    assert {name: getattr(args, name) for name in reporting.parameters(spec)} == dict.fromkeys(
        reporting.parameters(spec), "x"
    )


@SPECS
def test_the_dashboard_has_a_page_and_a_filter_form_for_the_spec(spec: ReportSpec) -> None:
    fields = rendering.form_fields(spec)
    assert [f.name for f in fields] == [n for n in reporting.parameters(spec) if n not in ("limit", "cursor")]
    assert all(f.help == reporting.describe(spec, f.name) for f in fields)
    assert "/" + reporting.slug(spec) in {getattr(r, "path", "") for r in dashboard.routes()}


def test_an_unknown_or_bad_parameter_is_refused_before_the_ledger_is_asked() -> None:
    spec = REPORTS[0]
    with pytest.raises(params.BadParameter) as info:
        reporting.parse(spec, {"sorce": "x"})
    assert (info.value.code, info.value.parameter) == ("unknown_parameter", "sorce")
    with pytest.raises(params.BadParameter) as info:
        reporting.parse(spec, {"sort": "amount"})
    assert info.value.code == "invalid_sort"
