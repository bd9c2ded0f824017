#!/usr/bin/env bash
# Runs every test: unit tests, and integration tests against the real test
# environment (upstream kube-apiserver, etcd, kube-controller-manager,
# kube-scheduler and kwok; sshd on test hosts in network namespaces; real
# worker nodes' containerd, runc, CNI plugins and kubelet, and images from an
# OCI registry).
#
# First it installs the Debian packages the test hosts and the builds need
# (scripts/testhost-deps.sh; needs root), builds the upstream binaries
# (scripts/testenv-bins.sh) and the worker nodes' software
# (scripts/node-software.sh: registry, node artifacts, images; needs root),
# all cached outside the repository (a warm cache takes a second), so that no
# test waits for a build. The node software builds in the background, at the
# lowest priority, while cargo builds the workspace and the tests; its
# progress lines are printed as they come, and its logs are in
# target/node-software-logs. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -x scripts/testhost-deps.sh ]; then
  scripts/testhost-deps.sh
fi
KOK_TESTENV_BIN_DIR=$(scripts/testenv-bins.sh | tail -n 1)
export KOK_TESTENV_BIN_DIR
echo "test binaries: $KOK_TESTENV_BIN_DIR"

# In a session of its own, so that stopping it stops its builds too.
setsid scripts/node-software.sh target/node-software-logs &
node_software=$!
trap 'kill -- -$node_software 2>/dev/null || true' EXIT

# A test binary still running after this (the longest takes under 7 minutes)
# prints its threads' stacks and fails, rather than running the whole test run
# out of time (crates/testenv/src/watchdog.rs).
export KOK_TEST_BINARY_TIMEOUT="${KOK_TEST_BINARY_TIMEOUT:-20m}"
# The dev environment's test runs the operator binaries, which cargo test does
# not build for it.
cargo build --workspace --bins
cargo test --workspace --no-run "$@"

if ! wait "$node_software"; then
  echo "building the worker nodes' software failed (see above)" >&2
  exit 1
fi
trap - EXIT
exec cargo test --workspace "$@"
