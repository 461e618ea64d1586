#!/usr/bin/env bash
# The project's test command. On a fresh Debian machine it installs and starts what the
# tests need (PostgreSQL, NATS with JetStream, RabbitMQ, Redis, MariaDB, kcat, PgBouncer,
# promtool, Chromium, and the fauxqs SQS and kinesalite Kinesis emulators from npm), then runs the suite. Safe to run again:
# it only acts on what is missing.
#
#   scripts/test.sh            # everything (race detector on the fast packages)
#   scripts/test.sh -short     # the same, with the broker outage shortened from 30 s to 5 s
#
# The suite runs in phases (vet, the race phase, end-to-end and torture runs, canaries). A
# failed phase does not stop the later ones; at the end the script prints each phase's
# duration and result, the packages and tests that failed, and the ten slowest tests, and
# exits 1 if anything failed. The go test -json output of each phase is kept in
# OUTBOX_TEST_RESULTS (default: a new directory under $TMPDIR), for `go tool gotestsum tool
# slowest --jsonfile`.
#
# No test has a budget for how long its work takes: waits fail only when nothing has
# progressed for OUTBOX_TEST_STALL (default 2m), so a slow or loaded machine passes.
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

# The Kinesis tests run kinesalite, a Kinesis emulator from npm written in JavaScript, as a
# child process, its dependencies pinned by scripts/kinesalite's lockfile. It keeps its
# streams in memory (its native LevelDB module is not built, and not needed).
ensure_kinesalite() {
  local dir="${OUTBOX_KINESALITE_DIR:-$HOME/.cache/outbox/kinesalite}"
  if cmp -s scripts/kinesalite/package-lock.json "$dir/package-lock.json" && [ -d "$dir/node_modules/kinesalite" ]; then
    return 0
  fi
  need_pkg npm npm
  log "installing kinesalite (Kinesis emulator) into $dir"
  mkdir -p "$dir"
  cp scripts/kinesalite/package.json scripts/kinesalite/package-lock.json "$dir/"
  (cd "$dir" && npm ci --silent --no-fund --no-audit >/dev/null)
}

results=${OUTBOX_TEST_RESULTS:-$(mktemp -d "${TMPDIR:-/tmp}/outbox-test.XXXXXX")}
mkdir -p "$results"
rm -f "$results"/*.json "$results"/all.json.txt
phases=()
failed=0
started=$SECONDS

duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# record name seconds result: one line of the summary's phase table.
record() { phases+=("$(printf '%-30s %7s  %s' "$1" "$2" "$3")"); }

# phase name command...: runs one phase, records its duration and result, and goes on.
phase() {
  local name=$1 start=$SECONDS rc=0
  shift
  log "$name"
  current=$name
  "$@" || rc=$?
  current=
  local result=ok
  if [ "$rc" != 0 ]; then result="FAILED (exit $rc)"; failed=1; fi
  record "$name" "$(duration $((SECONDS - start)))" "$result"
}

# gotest name go-test-args...: go test through gotestsum, one line per package, failures in
# full, the -json stream kept as $results/name.json.
gotest() {
  local name=$1
  shift
  go tool gotestsum --format pkgname-and-test-fails --hide-summary=skipped \
    --jsonfile "$results/$name.json" -- "$@"
}

summary() {
  local rc=$?
  [ "$rc" = 0 ] || failed=1
  {
    if [ -n "${current:-}" ]; then
      record "$current" "" "FAILED (exit $rc): nothing after it ran"
    fi
    echo
    echo "test.sh summary ($(duration $((SECONDS - started))) in all; go test -json in $results)"
    local p
    for p in "${phases[@]}"; do echo "  $p"; done
    if ls "$results"/*.json >/dev/null 2>&1; then
      # A package's own fail line has no "Test" field; a test's has one.
      local fails
      fails=$(cat "$results"/*.json | grep -h '"Action":"fail"' |
        sed -nE 's/.*"Package":"([^"]*)"(,"Test":"([^"]*)")?.*/\1 \3/p' | sort -u || true)
      if [ -n "$fails" ]; then
        echo "failed packages and tests:"
        printf '%s\n' "$fails" | sed 's/^/  /'
      fi
      echo "slowest tests (top-level):"
      cat "$results"/*.json > "$results/all.json.txt"
      go tool gotestsum tool slowest --jsonfile "$results/all.json.txt" --threshold 100ms 2>/dev/null |
        awk '$2 !~ /\// { sub("^github.com/outboxkit/outbox", ".", $1); printf "  %-40s %-48s %s\n", $1, $2, $3 }' |
        head -10 || true
    fi
    if [ "$failed" = 0 ]; then echo "test.sh: PASS"; else echo "test.sh: FAIL"; fi
  } >&2
  [ "$rc" = 0 ] || exit "$rc"
  [ "$failed" = 0 ] || exit 1
}
trap summary EXIT
# go test and gotestsum exit with status 1 on Ctrl-C, like a failure: stop here instead of
# starting the next phase.
trap 'log "interrupted"; exit 130' INT TERM

setup() {
  ensure_postgres
  ensure_nats
  ensure_rabbitmq
  ensure_redis
  ensure_mariadb
  ensure_fauxqs
  ensure_kinesalite
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
  # Build gotestsum (a tool in go.mod) and every test binary up front (-exec /bin/true
  # links them and runs nothing), so download and compile time is counted here and the
  # phases' times are the tests'.
  go tool gotestsum --version >/dev/null
  fast=$(go list ./... | grep -v -e '/e2e$' -e '/internal/testinfra/torture/chaos$')
  # shellcheck disable=SC2086 # $fast is a list of packages
  go test -race -count=1 -exec /bin/true $fast >/dev/null
  go test -count=1 -exec /bin/true ./e2e ./internal/testinfra/torture/chaos >/dev/null
  go test -tags outbox_broken -count=1 -exec /bin/true ./internal/testinfra/torture/chaos >/dev/null
}

vet() {
  go vet ./... && go vet -tags outbox_broken ./internal/...
}

short=
for a in "$@"; do [ "$a" = -short ] && short=-short; done

# Set-up runs under set -e: any failure ends the script (the summary says where).
log "set-up"
current="set-up"
setup
record "set-up" "$(duration $((SECONDS - started)))" ok
current=
phase "go vet" vet
# Fast packages ($fast, listed by setup) under the race detector; the end-to-end fault
# tests and the torture runs (child processes, broker and database restarts) run without
# it, since race mode slows them 5-10x and they test processes, not memory. -timeout bounds
# a hang of a whole package, not how long its tests may take: waits inside tests have
# their own stall detection.
# shellcheck disable=SC2086 # $fast is a list of packages
phase "unit and integration (-race)" gotest race -race -count=1 -timeout 20m $short $fast
phase "end-to-end and torture" gotest e2e -count=1 -timeout 30m $short ./e2e ./internal/testinfra/torture/chaos
# The canaries: relays broken on purpose (build tag outbox_broken) that the torture runs
# must catch.
phase "torture canaries" gotest canaries -tags outbox_broken -count=1 -timeout 20m $short \
  -run '^TestCanar' ./internal/testinfra/torture/chaos
# The relay-side canaries against the relay's in-memory tests (relay_mem_test.go): each bug
# must make at least one of them fail, with no database involved.
mem_canaries() {
  local bug rc=0
  for bug in mark-before-confirm no-key-gate cursor-polling priority-overtakes; do
    # The whole output first: under pipefail, grep -q ending the pipe early would fail it.
    local out
    out=$(OUTBOX_BROKEN=$bug go test -tags outbox_broken -count=1 -run '^TestMemRelay' . 2>&1 || true)
    if grep -q -- '--- FAIL: TestMemRelay' <<<"$out"; then
      log "canary $bug: caught by the in-memory relay tests"
    else
      log "canary $bug: NOT caught by the in-memory relay tests"
      rc=1
    fi
  done
  return $rc
}
phase "in-memory canaries" mem_canaries
# outboxpgx's stall watch, broken both ways: one that watches nothing must let a fetch on
# a silenced connection run into its deadline (OUTBOX_TEST_STALL); one that takes a
# running statement for a silent one, or a session waiting for its client for one its
# statement never reached, must close it; one that forgets a session given up on must
# leave its lock held. A listener that takes the gate held by its own closed session for
# another relay's must answer covered, and the parked outboxes' watch must stay unwoken.
stall_canaries() {
  local bug tests rc=0
  while read -r bug tests; do
    local out
    out=$(OUTBOX_TEST_STALL=10s OUTBOX_BROKEN=$bug go test -tags outbox_broken -count=1 -run "$tests" ./outboxpgx 2>&1 || true)
    if grep -q -- '--- FAIL: Test' <<<"$out"; then
      log "canary $bug: caught by $tests"
    else
      log "canary $bug: NOT caught by $tests"
      rc=1
    fi
  done <<'EOF'
no-stall-watch ^TestStall
stall-kills-slow ^TestStall
stall-idle-unsent ^TestStall
stall-keeps-orphans ^TestStall
gate-keeps-left ^Test(Gate|IdleWatch)LeftSessionEnded$
EOF
  return $rc
}
phase "stall canaries" stall_canaries
# The container image (deploy/Containerfile), built and run against the local servers.
# podman's default runtime (crun) refuses hybrid cgroup hierarchies, which some machines
# have; scripts/image.sh runs the image under runc there. Installed here, not at set-up:
# a machine without apt still runs everything else.
if need_pkg podman podman 2>/dev/null && command -v podman >/dev/null; then
  need_pkg runc runc
  phase "container image" scripts/image.sh --check
else
  log "container image: skipped, podman is not installed and could not be (apt-get install podman)"
  record "container image" "-" "skipped: podman is not installed"
fi
