#!/bin/sh
# systemd-analyze verify the units in this directory (make deploy-check runs it).
#     deploy/systemd/verify.sh PATH-TO-effectgate
# verify insists that every ExecStart binary exists and is executable. The units name the documented
# install path /opt/effectgate/bin/effectgate, which a CI machine does not have, so each unit is
# verified from a temporary copy pointing at an effectgate that is installed (the current
# environment's console script). Anything verify prints about our units (an unknown key, a bad
# value, a missing binary) fails the check: on its own, verify only warns and exits 0 for those.
# Then `systemd-analyze security --offline` scores each unit's sandbox: above EXPOSURE_MAX (in tenths,
# 20 = 2.0 on systemd's 0-10 scale; the units score 1.4 today) fails, so a loosened sandbox is noticed.
set -eu
EXPOSURE_MAX=20
exe=${1:?usage: verify.sh PATH-TO-effectgate}
if [ ! -x "$exe" ]; then
    echo "verify.sh: $exe is not an executable effectgate (pip install effectgate first)" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A template (name@.service) is verified as an instance of it (name@9101.service): verify needs one.
for unit in "$here"/*.service; do
    sed "s#/opt/effectgate/bin/effectgate#$exe#g" "$unit" >"$work/$(basename "$unit" | sed 's/@\.service$/@9101.service/')"
done
status=0
out=$(systemd-analyze verify "$work"/*.service 2>&1) || status=$?
ours=$(printf '%s\n' "$out" | grep 'effectgate-' || true)
if [ "$status" -ne 0 ] || [ -n "$ours" ]; then
    printf '%s\n' "$out" >&2
    echo "verify.sh: systemd-analyze verify found problems in deploy/systemd (exit $status)" >&2
    exit 1
fi
for unit in "$work"/*.service; do
    if ! report=$(systemd-analyze security --offline=true --threshold="$EXPOSURE_MAX" "$unit" 2>&1); then
        printf '%s\n' "$report" >&2
        echo "verify.sh: $(basename "$unit") is more exposed than $EXPOSURE_MAX/100" >&2
        exit 1
    fi
    printf '%s\n' "$report" | tail -n 1
done
echo "systemd-analyze verify: $(ls "$here"/*.service | wc -l) units OK"
