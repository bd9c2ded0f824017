#!/usr/bin/env bash
# Pushes the operators' images, made of this workspace's binaries, for a
# meta-cluster whose nodes pull them under their upstream names through
# containerd's mirror (the `<host>/<repo>` layout of scripts/node-images.sh):
#
#   ghcr.io/kube-on-kube/kube-on-kube-operator:<TAG>
#   ghcr.io/kube-on-kube/node-operator:<TAG>
#
# pushed as <REGISTRY>/ghcr.io/kube-on-kube/<name>:<TAG> into the registry
# --registry names, or, without it, into the storage of node-images.sh that
# the tests' and the dev environment's registry serve (through a registry of
# its own on loopback, one push at a time). Each is the
# operators' base that `scripts/node-images.sh --meta` builds
# (kube-on-kube.test/operator-base:bookworm: Debian bookworm with
# openssh-client and ca-certificates, user and group nonroot, 65532) plus one
# layer holding BIN_DIR/<name> as /usr/local/bin/<name> (root, 0755), which
# is the entrypoint, run as 65532:65532, for linux/amd64. The binaries are
# cargo's builds (debug ones too), linked dynamically against the glibc of
# the machine that built them, Debian bookworm: hence the base. TAG defaults
# to the chart's appVersion (charts/kube-on-kube/Chart.yaml), the tag the
# chart deploys.
#
# The registry speaks plain HTTP and takes pushes. One that lacks the base
# (or holds another build of it) first gets it from the OCI layout
# node-images.sh keeps beside its storage, its compressed layers as they are
# stored; after that only the binaries' layers are compressed and uploaded.
# Prints the two pushed references with their digests.
#
# Needs crane (scripts/registry-bins.sh) and the base (scripts/node-images.sh
# --meta, which waits for a build of it already running and builds it, as
# root, when it is missing).
#
#   scripts/operator-images.sh target/debug
#   scripts/operator-images.sh --registry 127.0.0.1:5000 target/release 0.2.0-dev
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
usage="usage: $0 [--registry HOST:PORT] BIN_DIR [TAG]"
reg=""
if [ "${1:-}" = --registry ]; then
  [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
  reg=$2
  shift 2
fi
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "$usage" >&2; exit 2; }
bin_dir=$1
tag=${2:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$here/../charts/kube-on-kube/Chart.yaml")}
[ -n "$tag" ] || { echo "no appVersion in charts/kube-on-kube/Chart.yaml: give TAG" >&2; exit 2; }
OPERATORS=(kube-on-kube-operator node-operator)
# As scripts/node-images.sh names it.
OPERATOR_BASE=kube-on-kube.test/operator-base:${DEBIAN_SUITE:-bookworm}

log() { echo "[operator-images] $*" >&2; }
die() { echo "[operator-images] error: $*" >&2; exit 1; }
for name in "${OPERATORS[@]}"; do
  [ -x "$bin_dir/$name" ] || die "no executable $bin_dir/$name"
done

crane="$("$here/registry-bins.sh" | tail -n1)/crane"
images=$("$here/node-images.sh" --meta | tail -n1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# crane, its progress lines shown only when it fails.
cr() {
  "$crane" --insecure "$@" 2>"$work/crane.log" || { cat "$work/crane.log" >&2; die "crane $1 failed"; }
}
seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

if [ -z "$reg" ]; then
  # The images' storage, written by a registry of our own while we hold
  # node-images.sh's lock on its cache (its builds write there too).
  exec 9>"$images/.lock"
  flock 9
  . "$here/local-registry.sh"
  trap 'if [ -n "${regpid:-}" ]; then kill "$regpid" 2>/dev/null; wait "$regpid" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
  serve_registry "$("$here/registry-bins.sh" | tail -n1)/registry" "$images/registry" "$work"
fi

base_digest=$(cat "$images/done/$(echo "$OPERATOR_BASE" | tr '/:' '__')")
base="$reg/$OPERATOR_BASE"
if [ "$("$crane" digest --insecure "$base" 2>/dev/null || true)" != "$base_digest" ]; then
  t0=$(date +%s.%N)
  cr push "$images/operator-base.oci" "$base" >/dev/null
  [ "$(cr digest "$base")" = "$base_digest" ] || die "$base is not $base_digest"
  log "pushed $OPERATOR_BASE@$base_digest to $reg in $(seconds_since "$t0")s"
fi

for name in "${OPERATORS[@]}"; do
  t0=$(date +%s.%N)
  # One file, its parents being the base's; reproducible like node-images.sh's
  # layers.
  tar -C "$bin_dir" --dereference --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    --mode=0755 --transform='s,^,usr/local/bin/,' --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -cf "$work/$name.tar" "$name"
  ref="$reg/ghcr.io/kube-on-kube/$name:$tag"
  cr append -b "$base" -f "$work/$name.tar" -t "$ref" >/dev/null
  cr mutate "$ref" --set-platform linux/amd64 --entrypoint "/usr/local/bin/$name" \
    --user 65532:65532 -t "$ref" >/dev/null
  digest=$(cr digest "$ref")
  rm -f "$work/$name.tar"
  log "pushed $name ($(du -m "$bin_dir/$name" | cut -f1) MB) in $(seconds_since "$t0")s"
  echo "$ref@$digest"
done
