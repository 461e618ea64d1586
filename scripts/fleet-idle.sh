#!/usr/bin/env bash
# fleet-idle.sh N [PARK_AFTER] [SETTLE]: what N idle outboxes cost one `outbox relay`
# process serving them all. It makes N migrated schemas (fleetidle<N>x_1 ...), once, in
# the database of OUTBOX_DATABASE_URL, starts the relay on a config file whose outboxes
# list has the rule schemas: fleetidle<N>x_*, waits SETTLE seconds (default 30), and
# prints the database's transactions a second over the next 20 seconds, the relay's RSS
# and its connections. PARK_AFTER is --park-after (default 1m; -1: every relay runs).
# Needs psql and a NATS server at OUTBOX_BROKER (default nats://127.0.0.1:4222); the
# relay publishes nothing (the outboxes stay empty).
set -euo pipefail
n=${1:?usage: fleet-idle.sh N [PARK_AFTER] [SETTLE]}
park=${2:-1m}
settle=${3:-30}
export OUTBOX_DATABASE_URL=${OUTBOX_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
broker=${OUTBOX_BROKER:-nats://127.0.0.1:4222}
cd "$(dirname "$0")/.."
bin=$(mktemp -d)/outbox
go build -o "$bin" ./cmd/outbox
q() { psql "$OUTBOX_DATABASE_URL" -Atc "$1"; }
have=$(q "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'fleetidle${n}x\_%'")
if [ "$have" -lt "$n" ]; then
  echo "fleet-idle: migrating $((n - have)) schemas" >&2
  seq $((have + 1)) "$n" | xargs -P 4 -I{} env OUTBOX_SCHEMA="fleetidle${n}x_{}" "$bin" migrate up >/dev/null
fi
config=$(mktemp)
cat >"$config" <<EOC
broker: $broker
route: fleetidle.{topic}
park-after: $park
log-format: json
outboxes:
  - schemas: fleetidle${n}x_*
EOC
"$bin" relay --config "$config" >"$config.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
sleep "$settle"
xacts() { q "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"; }
a=$(xacts)
sleep 20
b=$(xacts)
app=$(q "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'outbox relay'")
printf 'outboxes=%s park_after=%s xacts_per_s=%s rss_mib=%s connections=%s\n' "$n" "$park" \
  "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (b - a) / 20 }')" \
  "$(awk '/VmRSS/ { printf "%.0f", $2 / 1024 }' /proc/$pid/status)" "$app"
