#!/bin/sh
# systemd-analyze verify the units in this directory (make deploy-check runs it).
#     deploy/systemd/verify.sh PATH-TO-effectgate
# verify insists that every ExecStart binary exists and is executable. The units name the documented
# install path /opt/effectgate/bin/effectgate, which a CI machine does not have, so each unit is
# verified from a temporary copy pointing at an effectgate that is installed (the current
# environment's console script). Anything verify prints about our units (an unknown key, a bad
# value, a missing binary) fails the check: on its own, verify only warns and exits 0 for those.
set -eu
exe=${1:?usage: verify.sh PATH-TO-effectgate}
if [ ! -x "$exe" ]; then
    echo "verify.sh: $exe is not an executable effectgate (pip install effectgate first)" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for unit in "$here"/*.service; do
    sed "s#/opt/effectgate/bin/effectgate#$exe#g" "$unit" >"$work/$(basename "$unit")"
done
status=0
out=$(systemd-analyze verify "$work"/*.service 2>&1) || status=$?
ours=$(printf '%s\n' "$out" | grep 'effectgate-' || true)
if [ "$status" -ne 0 ] || [ -n "$ours" ]; then
    printf '%s\n' "$out" >&2
    echo "verify.sh: systemd-analyze verify found problems in deploy/systemd (exit $status)" >&2
    exit 1
fi
echo "systemd-analyze verify: $(ls "$here"/*.service | wc -l) units OK"
