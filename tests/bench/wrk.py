"""wrk as the load generator of the backlog and attack benchmarks: signed pools, scripts, parsed results.

wrk's Lua has no HMAC, and a Python load generator would be the bottleneck on a 2-core machine. So the
deliveries are signed in Python before the run, each with its own body, key and signature, and wrk cycles
through the pool: the gateway verifies a distinct signature and claims a new key on every request, exactly
the work a per-request signer would give it. A pool is larger than what a run sends, or (``once``) wrk
stops itself when the pool is spent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

SECRET = "whsec_bench"

# Each line of a pool file is "<Stripe-Signature>\t<body>". With ``once`` (args[3] == "once") each
# delivery is sent one time and the thread stops when every answer is in: the backlog is exactly the pool.
POOL_LUA = """
local reqs = {}
local i = 0
local answered = 0
local once = false
init = function(args)
  once = args[3] == "once"
  for line in io.lines(args[1]) do
    local sig, body = line:match("^(%S+)\\t(.*)$")
    reqs[#reqs + 1] = wrk.format("POST", args[2],
      {["Content-Type"] = "application/json", ["Stripe-Signature"] = sig}, body)
  end
end
request = function()
  i = i % #reqs + 1
  return reqs[i]
end
response = function(status, headers, body)
  answered = answered + 1
  if once and answered >= #reqs then wrk.thread:stop() end
end
"""

# One fixed request, replayed: a body read from args[1] (binary-safe), a Stripe-Signature of args[3].
FIXED_LUA = """
local req
init = function(args)
  local f = io.open(args[1], "rb")
  local body = f:read("*a")
  f:close()
  req = wrk.format("POST", args[2],
    {["Content-Type"] = "application/json", ["Stripe-Signature"] = args[3]}, body)
end
request = function() return req end
"""


def sign(body: str, t: int, secret: str = SECRET) -> str:
    """A Stripe-Signature header for ``body`` at unix time ``t``."""
    mac = hmac.new(secret.encode(), f"{t}.{body}".encode(), hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def delivery_body(event_id: str, n: int) -> str:
    """A 2 KB Stripe-shaped event, the size the ingress benchmark sends."""
    return json.dumps(
        {"id": event_id, "type": "bench.event", "data": {"object": {"n": n, "pad": "x" * 1900}}}
    )


def write_pool(path: Path, count: int, run: str | None = None) -> Path:
    """``count`` distinct Stripe-signed 2 KB deliveries, one signature each, signed now.

    The same ``run`` gives the same deliveries, signed afresh: Stripe's timestamp tolerance (300 s) would
    turn an older pool into a flood of 401s.
    """
    t = int(time.time())
    run = run or uuid.uuid4().hex[:8]
    with path.open("w") as out:
        for n in range(count):
            body = delivery_body(f"evt_{run}_{n}", n)
            out.write(f"{sign(body, t)}\t{body}\n")
    return path


@dataclass(frozen=True)
class WrkResult:
    """What one wrk run reported."""

    requests: int
    rate: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int

    @property
    def errors(self) -> int:
        return self.non_2xx + self.socket_errors

    def line(self) -> str:
        if self.requests == 0:
            # Every request still in flight when the run ended: wrk counts none of them, not even as errors.
            return "NO ANSWER within the run (0 requests completed)"
        return (
            f"{self.requests} answered, {self.rate:.0f} req/s, p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, "
            f"non-2xx {self.non_2xx}, socket errors {self.socket_errors}"
        )


def _ms(text: str | None) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text or "")
    if match is None:
        return float("nan")
    return float(match.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[match.group(2)]


def parse(stdout: str) -> WrkResult:
    """The figures of wrk's ``--latency`` report."""
    total = re.search(r"(\d+) requests in", stdout)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", stdout)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", stdout)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", stdout)
    requests = int(total.group(1)) if total else 0
    return WrkResult(
        requests=requests,
        rate=float(rate.group(1)) if rate else float("nan"),
        # No answer at all is an unbounded latency, not a 0 ms one.
        p50_ms=_ms(m.group(1) if (m := re.search(r"^\s+50%\s+(\S+)", stdout, re.M)) else None)
        if requests
        else float("inf"),
        p99_ms=_ms(m.group(1) if (m := re.search(r"^\s+99%\s+(\S+)", stdout, re.M)) else None)
        if requests
        else float("inf"),
        non_2xx=int(errors.group(1)) if errors else 0,
        socket_errors=sum(int(g) for g in sock.groups()) if sock else 0,
    )


def start(
    wrk: str,
    base: str,
    script: Path,
    args: list[str],
    *,
    connections: int,
    seconds: float,
    threads: int = 1,
    timeout: str = "10s",
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """wrk in the background; ``finish`` waits for it and parses its report. Stops by itself."""
    return subprocess.Popen(
        [
            wrk,
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            f"--timeout={timeout}",
            "--latency",
            "-s",
            str(script),
            base,
            "--",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen[str]) -> WrkResult:
    stdout, _ = proc.communicate()
    return parse(stdout)


def stop(proc: subprocess.Popen[str]) -> WrkResult:
    """Stop a background wrk now: on SIGINT it stops its threads and still prints its report."""
    proc.send_signal(signal.SIGINT)
    return finish(proc)


def script(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path
