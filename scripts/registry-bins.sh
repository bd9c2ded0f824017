#!/usr/bin/env bash
# Builds the OCI registry and the registry client the test environment uses for
# the worker nodes' images: `registry` (github.com/distribution/distribution/v3)
# and `crane` (github.com/google/go-containerregistry), from their Go modules,
# cached outside the repository.
#
# Idempotent: when both binaries are in the cache, it prints the directory and
# exits without building.
#
#   scripts/registry-bins.sh         # build if needed, print the bin directory
#   KOK_TESTENV_DIR=/some/dir scripts/registry-bins.sh
set -euo pipefail

REGISTRY_VERSION=${REGISTRY_VERSION:-v3.1.2}
CRANE_VERSION=${CRANE_VERSION:-v0.22.1}

root=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
dir="$root/registry-$REGISTRY_VERSION-crane-$CRANE_VERSION"
bin="$dir/bin"

if [ -x "$bin/registry" ] && [ -x "$bin/crane" ]; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "go is required to build the registry tools" >&2; exit 1; }
mkdir -p "$bin" "$dir/src"
log() { echo "[registry-bins] $*" >&2; }
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

build_install() { # name module-path version [ldflags]
  [ -x "$bin/$1" ] && return 0
  local t0 t
  t0=$(date +%s)
  log "building $1 $3"
  (cd "$dir/src" && GOBIN="$bin" nice -n 19 go install -trimpath -ldflags "-s -w ${4:-}" "$2@$3")
  t=$(( $(date +%s) - t0 ))
  log "$1 built in ${t}s"
  sed -i "/^$1 /d" "$dir/build-seconds" 2>/dev/null || true
  echo "$1 $t" >>"$dir/build-seconds"
}

build_install registry github.com/distribution/distribution/v3/cmd/registry "$REGISTRY_VERSION" \
  "-X github.com/distribution/distribution/v3/version.version=$REGISTRY_VERSION"
build_install crane github.com/google/go-containerregistry/cmd/crane "$CRANE_VERSION"

[ -x "$bin/registry" ] && [ -x "$bin/crane" ] || { echo "registry or crane missing in $bin" >&2; exit 1; }
echo "$bin"
