#!/bin/sh
# Entrypoint for localhost/postgres:15-bookworm (Debian's postgresql-15, no entrypoint of its own) in
# `make deploy-run`: what the official postgres image's entrypoint does for POSTGRES_USER, POSTGRES_DB
# and POSTGRES_PASSWORD, in short. Creates the cluster on first start, then execs postgres as the
# postgres user, so SIGTERM from `podman stop` reaches the server itself.
set -eu
bin=/usr/lib/postgresql/15/bin
data=${PGDATA:-/var/lib/postgresql/data}
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
[ "${1:-}" = postgres ] && shift
mkdir -p "$data"
chown postgres:postgres "$data"
chmod 0700 "$data"
if [ ! -s "$data/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" >"$pwfile"
    chown postgres "$pwfile"
    as_postgres "$bin/initdb" --pgdata="$data" --username="${POSTGRES_USER:-postgres}" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$data/pg_hba.conf"
    if [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != postgres ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"${POSTGRES_USER:-postgres}\";" \
            | as_postgres "$bin/postgres" --single -D "$data" postgres >/dev/null
    fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups "$bin/postgres" -D "$data" \
    -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
