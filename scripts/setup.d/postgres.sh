#!/usr/bin/env bash
# PostgreSQL on loopback for the distributed-search tests (tests/test_search_distributed.py).
#
# Idempotent: installs PostgreSQL with apt-get if it is missing, starts a server on
# 127.0.0.1:${SPECTUNE_PG_PORT:-5432}, and creates the role and database the tests use:
#   postgresql://spectune:spectune@127.0.0.1:5432/spectune_test
# (the tests' default SPECTUNE_TEST_POSTGRES_URL). Exports nothing. Needs root (CI runs it as
# root on a fresh Debian machine); without root it says so and leaves the machine alone.
set -euo pipefail

PORT=${SPECTUNE_PG_PORT:-5432}
ROLE=spectune
PASSWORD=spectune
DB=spectune_test

log() { echo "setup.d/postgres: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "not root; skipping (tests needing PostgreSQL skip unless CI is set)"
  exit 0
fi

pg_bin() {  # newest installed server version's bin folder, or nothing
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

if [ -z "$(pg_bin)" ] || ! command -v pg_ctlcluster >/dev/null 2>&1; then
  log "installing PostgreSQL with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q postgresql
fi

BIN=$(pg_bin)
VERSION=$(basename "$(dirname "$BIN")")

as_postgres() { runuser -u postgres -- "$@"; }

if ! "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
  if ! pg_lsclusters -h 2>/dev/null | awk -v v="$VERSION" '$1 == v && $2 == "main"' | grep -q .; then
    log "creating cluster $VERSION/main on port $PORT"
    pg_createcluster "$VERSION" main --port "$PORT" >/dev/null
  fi
  # Loopback only; the Debian default pg_hba.conf allows password logins from 127.0.0.1.
  CONF=/etc/postgresql/$VERSION/main/postgresql.conf
  sed -i -E "s/^#?listen_addresses *=.*/listen_addresses = '127.0.0.1'/" "$CONF"
  sed -i -E "s/^#?port *=.*/port = $PORT/" "$CONF"
  log "starting cluster $VERSION/main"
  pg_ctlcluster "$VERSION" main start || true
  for _ in $(seq 1 60); do
    "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" && break
    sleep 0.5
  done
fi
if ! "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
  log "server did not come up on 127.0.0.1:$PORT"
  exit 1
fi

# The postgres superuser logs in over the local socket (peer auth) to create role and database.
PSQL=(psql -X -q -v ON_ERROR_STOP=1 -p "$PORT" -d postgres)
if [ -z "$(as_postgres "${PSQL[@]}" -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" ]; then
  as_postgres "${PSQL[@]}" -c "CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'"
fi
if [ -z "$(as_postgres "${PSQL[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" ]; then
  as_postgres "${PSQL[@]}" -c "CREATE DATABASE $DB OWNER $ROLE"
fi
log "ready: postgresql://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"
