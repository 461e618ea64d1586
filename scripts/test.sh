#!/usr/bin/env bash
# The project's test command. On a fresh Debian machine it installs and starts what the
# tests need (PostgreSQL, NATS with JetStream, RabbitMQ, Redis, MariaDB, kcat, PgBouncer,
# promtool, Chromium, and the fauxqs SQS emulator from npm), then runs the suite. Safe to run again:
# it only acts on what is missing.
#
#   scripts/test.sh            # everything (race detector on the fast packages)
#   scripts/test.sh -short     # the same, with the broker outage shortened from 30 s to 5 s
#
# Environment: OUTBOX_TEST_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test),
# OUTBOX_TEST_NATS_URL (default nats://127.0.0.1:4222), OUTBOX_TEST_AMQP_URL,
# OUTBOX_TEST_REDIS_ADDR, OUTBOX_TEST_MYSQL_DSN: a server named by one is used as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'test.sh: %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=
need_pkg() { # need_pkg command package
  command -v "$1" >/dev/null 2>&1 && return 0
  [ -x "/usr/sbin/$1" ] && return 0
  log "installing $2"
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # wait_port port name
  for _ in $(seq 1 60); do port_open "$1" && return 0; sleep 0.5; done
  log "$2 did not come up on port $1"; return 1
}

ensure_postgres() {
  if [ -n "${OUTBOX_TEST_DATABASE_URL:-}" ]; then return 0; fi
  need_pkg psql postgresql
  if ! port_open 5432; then
    log "starting PostgreSQL"
    local v; v=$(ls /etc/postgresql | sort -V | tail -1)
    as_root pg_ctlcluster --skip-systemctl-redirect "$v" main start
    wait_port 5432 PostgreSQL
  fi
  # Trust auth on loopback is how this machine is set up; create the test database.
  if ! psql -h 127.0.0.1 -U postgres -d postgres -Atc 'select 1' >/dev/null 2>&1; then
    log "cannot connect as postgres on 127.0.0.1: set OUTBOX_TEST_DATABASE_URL"; return 1
  fi
  if [ "$(psql -h 127.0.0.1 -U postgres -d postgres -Atc "select 1 from pg_database where datname='test'")" != 1 ]; then
    log "creating database test"
    psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test' >/dev/null
  fi
}

ensure_nats() {
  # The private servers of the outage tests need the binary even with a remote NATS.
  need_pkg nats-server nats-server
  if [ -n "${OUTBOX_TEST_NATS_URL:-}" ]; then return 0; fi
  if ! port_open 4222; then
    log "starting nats-server with JetStream"
    as_root mkdir -p /var/lib/nats-server
    as_root start-stop-daemon --start --oknodo --background --exec "$(command -v nats-server || echo /usr/sbin/nats-server)" -- \
      -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
    wait_port 4222 nats-server
  fi
}

ensure_rabbitmq() {
  if [ -n "${OUTBOX_TEST_AMQP_URL:-}" ]; then return 0; fi
  need_pkg rabbitmq-server rabbitmq-server
  if ! port_open 5672; then
    log "starting RabbitMQ"
    as_root rabbitmq-server -detached
    wait_port 5672 RabbitMQ
  fi
}

ensure_redis() {
  # Private servers, replicas and a cluster run as child processes even with a remote Redis.
  need_pkg redis-server redis-server
  if [ -n "${OUTBOX_TEST_REDIS_ADDR:-}" ]; then return 0; fi
  if ! port_open 6379; then
    log "starting Redis"
    as_root mkdir -p /var/lib/redis /var/log/redis
    as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
    wait_port 6379 Redis
  fi
}

ensure_mariadb() {
  if [ -n "${OUTBOX_TEST_MYSQL_DSN:-}" ]; then return 0; fi
  need_pkg mariadbd mariadb-server
  if ! port_open 3306; then
    log "starting MariaDB"
    as_root mkdir -p /run/mysqld
    as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
    as_root start-stop-daemon --start --oknodo --background --exec "$(command -v mariadbd || echo /usr/sbin/mariadbd)"
    wait_port 3306 MariaDB
  fi
}

# The SQS tests run fauxqs, an SQS emulator from npm, as a child process: version 1.9.2 (the
# last that runs on Debian 12's Node.js 20), its dependencies pinned by scripts/fauxqs's
# lockfile.
ensure_fauxqs() {
  local dir="${OUTBOX_FAUXQS_DIR:-$HOME/.cache/outbox/fauxqs}"
  if cmp -s scripts/fauxqs/package-lock.json "$dir/package-lock.json" && [ -d "$dir/node_modules/fauxqs" ]; then
    return 0
  fi
  need_pkg npm npm
  log "installing fauxqs (SQS emulator) into $dir"
  mkdir -p "$dir"
  cp scripts/fauxqs/package.json scripts/fauxqs/package-lock.json "$dir/"
  (cd "$dir" && npm ci --silent --no-fund --no-audit >/dev/null)
}

ensure_postgres
ensure_nats
ensure_rabbitmq
ensure_redis
ensure_mariadb
ensure_fauxqs
# The Kafka tests read back with kcat, an outside client.
need_pkg kcat kcat
# The alert rules are checked and unit-tested with promtool; the web console is tested in
# headless Chromium.
need_pkg promtool prometheus
need_pkg chromium chromium
# The deploy examples' systemd unit is checked with systemd-analyze verify.
need_pkg systemd-analyze systemd
# The PgBouncer test runs a private pgbouncer in transaction pooling mode.
need_pkg pgbouncer pgbouncer

short=
for a in "$@"; do [ "$a" = -short ] && short=-short; done

# Fast packages under the race detector; the end-to-end fault tests and the torture runs
# (child processes, broker and database restarts) run without it, since race mode slows
# them 5-10x and they test processes, not memory.
fast=$(go list ./... | grep -v -e '/e2e$' -e '/internal/torture/chaos$')
log "go vet"
go vet ./...
go vet -tags outbox_broken ./internal/...
log "unit and integration tests (-race)"
go test -race -count=1 -timeout 15m $short $fast
log "end-to-end fault tests and torture runs"
go test -count=1 -timeout 30m $short ./e2e ./internal/torture/chaos
# The canaries: relays broken on purpose (build tag outbox_broken) that the torture runs
# must catch.
log "torture canaries"
go test -tags outbox_broken -count=1 -timeout 20m $short -run '^TestCanar' ./internal/torture/chaos
