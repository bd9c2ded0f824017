#!/usr/bin/env bash
# Builds the OCI registry and the registry client the test environment uses for
# the worker nodes' images: `registry` (github.com/distribution/distribution/v3)
# and `crane` (github.com/google/go-containerregistry), from their Go modules,
# cached outside the repository.
#
# The registry is upstream's `registry` command (registry.RootCmd: `serve`,
# `garbage-collect`, `--version`) with the filesystem storage driver only.
# Upstream's cmd/registry also links in the other storage drivers with their
# cloud SDKs (s3-aws, azure, gcs, inmemory; the cloudfront, redirect and
# rewrite middlewares), the htpasswd, silly and token auth, the pull-through
# proxy and net/http/pprof: 419 of its 775 non-standard packages, and 60 % of
# its build time (126 CPU-seconds against 51 from cold). The test environment
# serves a directory, so a main of our own runs upstream's registry package
# with just that driver; the dependencies are upstream's (go.mod requires only
# distribution at $REGISTRY_VERSION). The cache directory's name says so
# ("-filesystem").
#
# Idempotent: when both binaries are in the cache, it prints the directory and
# exits without building. Runs that start together build once: the others wait
# for the first (flock).
#
#   scripts/registry-bins.sh         # build if needed, print the bin directory
#   KOK_TESTENV_DIR=/some/dir scripts/registry-bins.sh
set -euo pipefail

REGISTRY_VERSION=${REGISTRY_VERSION:-v3.1.2}
CRANE_VERSION=${CRANE_VERSION:-v0.22.1}

root=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
dir="$root/registry-$REGISTRY_VERSION-filesystem-crane-$CRANE_VERSION"
bin="$dir/bin"

have_all() { [ -x "$bin/registry" ] && [ -x "$bin/crane" ]; }
if have_all; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "go is required to build the registry tools" >&2; exit 1; }
mkdir -p "$bin" "$dir/src"
log() { echo "[registry-bins] $*" >&2; }
. "$(dirname "$0")/cache-lock.sh"
cache_lock "$dir" registry-bins have_all "$bin"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

timed() { # name command...
  local name=$1 t0 t
  shift
  t0=$(date +%s)
  "$@"
  t=$(( $(date +%s) - t0 ))
  log "$name built in ${t}s"
  sed -i "/^$name /d" "$dir/build-seconds" 2>/dev/null || true
  echo "$name $t" >>"$dir/build-seconds"
}

build_registry() {
  local m=github.com/distribution/distribution/v3 src="$dir/src/registry"
  mkdir -p "$src"
  cat >"$src/go.mod" <<GOMOD
module kube-on-kube.test/registry

go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/')

require $m $REGISTRY_VERSION
GOMOD
  cat >"$src/main.go" <<GO
// Upstream's registry command with the filesystem storage driver only.
package main

import (
	"os"

	"$m/registry"
	_ "$m/registry/storage/driver/filesystem"
)

func main() {
	if registry.RootCmd.Execute() != nil {
		os.Exit(1)
	}
}
GO
  log "building registry $REGISTRY_VERSION (filesystem storage only)"
  (cd "$src" && go mod tidy >&2 && nice -n 19 go build -trimpath \
    -ldflags "-s -w -X $m/version.version=$REGISTRY_VERSION" -o "$bin/registry.tmp" .)
  "$bin/registry.tmp" --version >&2
  mv "$bin/registry.tmp" "$bin/registry"
}

build_crane() {
  log "building crane $CRANE_VERSION"
  (cd "$dir/src" && GOBIN="$bin" nice -n 19 go install -trimpath -ldflags "-s -w" \
    "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION")
}

[ -x "$bin/registry" ] || timed registry build_registry
[ -x "$bin/crane" ] || timed crane build_crane

have_all || { echo "registry or crane missing in $bin" >&2; exit 1; }
echo "$bin"
