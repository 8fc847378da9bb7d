"""The command line run in the test's own process, as ``effectgate …`` would run it: its exit code and what it
printed. The CLI tests of several rooms use it."""

from __future__ import annotations

import logging

import pytest

from effectgate.gateway import cli


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    # main() points the root logger at the stderr of the moment, which capsys swaps out: put it back,
    # or later log lines go to a closed stream.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        code = cli.main(list(argv))
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    out, err = capsys.readouterr()
    return code, out, err
