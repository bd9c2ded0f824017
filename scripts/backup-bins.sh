#!/usr/bin/env bash
# Builds the programs the backup tests run beside etcd, from their Go modules,
# cached outside the repository:
#
# - `versitygw` (github.com/versity/versitygw, Apache-2.0), an S3-compatible
#   server; the tests run it with its POSIX backend on a temporary directory,
#   so snapshots go through a real S3 API (SigV4 signatures, multipart
#   uploads, conditional writes, TLS) into files. Of the S3 servers written in
#   Go it is the one with semver releases on the Go module proxy: MinIO
#   publishes only pseudo-versions (its releases are dated tags), so it cannot
#   be pinned like the other upstream binaries.
#   It is upstream's own command, all of it: a main of our own with only the
#   POSIX backend (through its embedgw package) would link 300 packages
#   instead of 390, too little to differ from what users run.
# - `etcdutl` of the etcd release scripts/testenv-bins.sh builds: since etcd
#   3.6, `etcdutl snapshot status` and `etcdutl snapshot restore` are where a
#   snapshot file is read offline (etcdctl no longer has them).
#
# Idempotent: when both binaries are in the cache, it prints the directory and
# exits without building. Runs that start together build once: the others wait
# for the first (flock). The last output line is the bin directory.
#
#   scripts/backup-bins.sh           # build if needed, print the bin directory
#   KOK_TESTENV_DIR=/some/dir scripts/backup-bins.sh
set -euo pipefail

VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
# The same etcd release as scripts/testenv-bins.sh, so that the snapshot
# format etcdutl reads is the one the tests' etcd writes.
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}

root=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
dir="$root/backup-versitygw-$VERSITYGW_VERSION-etcdutl-$ETCD_VERSION"
bin="$dir/bin"

have_all() { [ -x "$bin/versitygw" ] && [ -x "$bin/etcdutl" ]; }
if have_all; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "go is required to build the backup test binaries" >&2; exit 1; }
mkdir -p "$bin" "$dir/src"
log() { echo "[backup-bins] $*" >&2; }
. "$(dirname "$0")/cache-lock.sh"
cache_lock "$dir" backup-bins have_all "$bin"
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

go_version() { go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/'; }

build_versitygw() {
  local m=github.com/versity/versitygw
  log "building versitygw $VERSITYGW_VERSION"
  (cd "$dir/src" && GOBIN="$bin" nice -n 19 go install -trimpath \
    -ldflags "-s -w -X main.Version=$VERSITYGW_VERSION" "$m/cmd/versitygw@$VERSITYGW_VERSION")
  "$bin/versitygw" --version >&2
}

# etcd's modules carry replace directives, which `go install` refuses: a
# one-line main in a module of our own that requires etcdutl at the release.
build_etcdutl() {
  local src="$dir/src/etcdutl-$ETCD_VERSION"
  mkdir -p "$src"
  cat >"$src/go.mod" <<GOMOD
module kube-on-kube.test/etcdutl

go $(go_version)

require go.etcd.io/etcd/etcdutl/v3 $ETCD_VERSION
GOMOD
  # etcdutl's own main is in its module's root package, which cannot be
  # imported: the same commands, registered on a root command of our own.
  cat >"$src/main.go" <<'GO'
package main

import (
	"os"

	"github.com/spf13/cobra"

	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
)

func main() {
	root := &cobra.Command{Use: "etcdutl", Short: "An administrative command line tool for etcd3."}
	root.PersistentFlags().StringVarP(&etcdutl.OutputFormat, "write-out", "w", "simple",
		"set the output format (fields, json, protobuf, simple, table)")
	root.AddCommand(
		etcdutl.NewDefragCommand(),
		etcdutl.NewSnapshotCommand(),
		etcdutl.NewHashKVCommand(),
		etcdutl.NewVersionCommand(),
		etcdutl.NewMigrateCommand(),
	)
	if root.Execute() != nil {
		os.Exit(1)
	}
}
GO
  log "building etcdutl $ETCD_VERSION"
  (cd "$src" && go mod tidy >&2 && nice -n 19 go build -trimpath -ldflags "-s -w" -o "$bin/etcdutl.tmp" .)
  "$bin/etcdutl.tmp" version >&2
  mv "$bin/etcdutl.tmp" "$bin/etcdutl"
}

[ -x "$bin/versitygw" ] || timed versitygw build_versitygw
[ -x "$bin/etcdutl" ] || timed etcdutl build_etcdutl

have_all || { echo "versitygw or etcdutl missing in $bin" >&2; exit 1; }
echo "$bin"
