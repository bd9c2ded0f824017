#!/usr/bin/env bash
# Runs every test: unit tests, and integration tests against the real test
# environment (upstream kube-apiserver, etcd, kube-controller-manager,
# kube-scheduler and kwok; sshd on test hosts in network namespaces).
#
# Installs what the SSH test hosts need (Debian packages; needs root) and builds
# the upstream binaries once (cached; see scripts/testenv-bins.sh). Extra
# arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -x scripts/testhost-deps.sh ]; then
  scripts/testhost-deps.sh
fi
KOK_TESTENV_BIN_DIR=$(scripts/testenv-bins.sh | tail -n 1)
export KOK_TESTENV_BIN_DIR
echo "test binaries: $KOK_TESTENV_BIN_DIR"
# A test binary still running after this (the longest takes under 7 minutes)
# prints its threads' stacks and fails, rather than running the whole test run
# out of time (crates/testenv/src/watchdog.rs).
export KOK_TEST_BINARY_TIMEOUT="${KOK_TEST_BINARY_TIMEOUT:-20m}"
# The dev environment's test runs the operator binaries, which cargo test does
# not build for it.
cargo build --workspace --bins
exec cargo test --workspace "$@"
