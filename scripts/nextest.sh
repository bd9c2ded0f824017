#!/usr/bin/env bash
# Installs the test runner, cargo-nextest, from its crate on crates.io into a
# cache directory outside the repository, and prints that directory's bin/
# on its last line. scripts/test.sh runs every test binary with it: binaries
# side by side, test groups that cap the heavy ones, a timeout that names
# the test that hung, a JUnit report (.config/nextest.toml).
#
# Idempotent: with the pinned version already in the cache it prints the
# directory and exits. From cold, about 4 minutes of compiling on 2 cores.
#
#   scripts/nextest.sh
#   KOK_TESTENV_DIR=/some/dir scripts/nextest.sh
set -euo pipefail

NEXTEST_VERSION=${NEXTEST_VERSION:-0.9.151}

here=$(cd "$(dirname "$0")" && pwd)
root=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
dir="$root/nextest-$NEXTEST_VERSION"
bin="$dir/bin"
done_() { [ -x "$bin/cargo-nextest" ] && "$bin/cargo-nextest" nextest --version >/dev/null 2>&1; }

if done_; then
  echo "$bin"
  exit 0
fi
mkdir -p "$dir"
# shellcheck source=cache-lock.sh
. "$here/cache-lock.sh"
cache_lock "$dir" nextest done_ "$bin"

echo "[nextest] building cargo-nextest $NEXTEST_VERSION" >&2
start=$(date +%s)
# Its own target directory, so that the workspace's build cache and this one
# never invalidate each other; removed once the binary is installed. No
# self-update: the version is pinned here.
CARGO_TARGET_DIR="$dir/build" cargo install --quiet --locked \
  --no-default-features --features default-no-update \
  --version "$NEXTEST_VERSION" --root "$dir" cargo-nextest >&2
rm -rf "$dir/build"
echo "[nextest] cargo-nextest $NEXTEST_VERSION built in $(($(date +%s) - start))s" >&2
echo "$bin"
