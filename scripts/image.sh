#!/usr/bin/env bash
# Builds the outbox container image (deploy/Containerfile) with podman, from a static
# binary built by this machine's Go: the image starts FROM scratch, so no registry is
# needed.
#
#   scripts/image.sh [--tag outbox:dev]           build the image and print its size
#   scripts/image.sh --check [--tag outbox:dev]   build it, then run it: `outbox version`,
#       then `outbox migrate up` and `outbox relay` against the local PostgreSQL
#       (127.0.0.1:5432, database test) and NATS (127.0.0.1:4222) in a schema of their
#       own, until the relay's /readyz answers 200. Exit status 1 if any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

tag=outbox:dev
check=0
while [ $# -gt 0 ]; do
  case $1 in
    --tag) tag=$2; shift 2 ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
command -v podman >/dev/null || { echo "image.sh: podman is not installed (apt-get install podman)" >&2; exit 1; }

ctx=$(mktemp -d "${TMPDIR:-/tmp}/outbox-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
# The version is the tag the commit has (git describe), else the module's "(devel)"; the
# commit is stamped from git either way (-buildvcs=auto overrides a GOFLAGS that turns it
# off).
ldflags='-s -w'
if version=$(git describe --tags --dirty --match 'v*' 2>/dev/null); then
  ldflags="$ldflags -X main.version=$version"
fi
CGO_ENABLED=0 go build -trimpath -buildvcs=auto -ldflags="$ldflags" -o "$ctx/outbox" ./cmd/outbox
cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
echo 'nonroot:x:65532:65532:nonroot:/:/sbin/nologin' >"$ctx/passwd"
echo 'nonroot:x:65532:' >"$ctx/group"
podman build --quiet --tag "$tag" --file deploy/Containerfile "$ctx" >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$tag")
echo "image.sh: built $tag, $((size / 1024 / 1024)) MiB ($size bytes)"
[ "$check" = 1 ] || exit 0

# Sandboxes without CAP_SYS_RESOURCE cannot take podman's default resource limits, and
# crun refuses hybrid cgroup hierarchies: there, the container keeps this process's
# limits and runs under runc when it is installed.
conf="$ctx/containers.conf"
printf '[containers]\ndefault_ulimits = []\n' >"$conf"
export CONTAINERS_CONF=$conf
runtime=()
if ! podman run --rm "$tag" version >/dev/null 2>&1 && command -v runc >/dev/null; then
  runtime=(--runtime runc)
fi
run() { podman "${runtime[@]}" run --rm --network host "$@"; }

echo "image.sh: outbox version, in the image:"
run "$tag" version

schema=outbox_image_check
db="postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
name="outbox-image-check-$$"
addr=127.0.0.1:19187
cleanup() {
  podman "${runtime[@]}" rm --force --ignore "$name" >/dev/null 2>&1 || true
  psql -q -h 127.0.0.1 -U postgres -d test -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
  rm -rf "$ctx"
}
trap cleanup EXIT
run "$tag" migrate up --database-url "$db" --schema "$schema" >/dev/null
podman "${runtime[@]}" run --detach --name "$name" --network host "$tag" relay \
  --database-url "$db" --schema "$schema" --broker nats://127.0.0.1:4222 \
  --relay-id image-check --metrics-addr "$addr" >/dev/null
# /readyz answers once the database and the broker answered and a lease round ran. The
# bound is for a hang (a relay that never gets ready), not for how long that takes.
for _ in $(seq 1 600); do
  if curl -fsS "http://$addr/readyz" >/dev/null 2>&1; then
    echo "image.sh: the relay in the image is ready (GET /readyz: 200)"
    exit 0
  fi
  if [ "$(podman "${runtime[@]}" inspect --format '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
    break
  fi
  sleep 0.1
done
echo "image.sh: the relay in the image did not become ready; its log:" >&2
podman "${runtime[@]}" logs "$name" >&2 || true
exit 1
