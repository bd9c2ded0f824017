#!/usr/bin/env bash
# Runs every test: unit tests, and integration tests against the real test
# environment (upstream kube-apiserver, etcd, kube-controller-manager,
# kube-scheduler and kwok; sshd on test hosts in network namespaces; real
# worker nodes' containerd, runc, CNI plugins and kubelet, and images from an
# OCI registry).
#
# First it installs the Debian packages the test hosts and the builds need
# (scripts/testhost-deps.sh; needs root), builds the upstream binaries
# (scripts/testenv-bins.sh), the test runner (scripts/nextest.sh:
# cargo-nextest) and the worker nodes' software (scripts/node-software.sh:
# registry, node artifacts, images; needs root), all cached outside the
# repository (a warm cache takes a second). Cargo's target directory is
# cached there too (CARGO_TARGET_DIR, default
# ${KOK_TESTENV_DIR:-~/.cache/kube-on-kube}/target), so a fresh clone
# recompiles the workspace's own crates only.
#
# The test binaries run side by side under cargo-nextest
# (.config/nextest.toml: test groups cap the heavy ones, a test running too
# long is killed and named, a JUnit report). While the node software is
# still building, the tests that do not need it run first; the rest run once
# it is there. At the end a table gives each test binary's time
# (scripts/test-times.py), and the JUnit reports are under
# target/nextest/reports/.
#
#   scripts/test.sh                      # everything
#   scripts/test.sh -p node-operator     # arguments go to `cargo nextest run`
#   scripts/test.sh -E 'binary(machine)'
#   KOK_TEST_CPU=1 scripts/test.sh       # and what each test costs in CPU
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
mkdir -p "$CARGO_TARGET_DIR"
t0=$(date +%s)
phase() { echo "=== test.sh: $* (+$(($(date +%s) - t0))s)"; }

if [ -x scripts/testhost-deps.sh ]; then
  scripts/testhost-deps.sh
fi
KOK_TESTENV_BIN_DIR=$(scripts/testenv-bins.sh | tail -n 1)
export KOK_TESTENV_BIN_DIR
echo "test binaries: $KOK_TESTENV_BIN_DIR"

# In sessions of their own, so that stopping this script stops their builds.
logs="$CARGO_TARGET_DIR/node-software-logs"
setsid scripts/node-software.sh "$logs" &
node_software=$!
# At normal priority: the tests need it as soon as the workspace is built
# (a warm cache: at once; from cold it shares the CPU with that build).
setsid scripts/nextest.sh >"$CARGO_TARGET_DIR/nextest-install.log" 2>&1 &
nextest_install=$!
trap 'kill -- -$node_software -$nextest_install ${doctests:+-$doctests} 2>/dev/null || true' EXIT

# A test still running after this prints its threads' stacks and fails
# (crates/testenv/src/watchdog.rs), before nextest's own limit for the
# control-plane group (15 minutes, .config/nextest.toml) kills it without
# them; other tests nextest stops at 10.
export KOK_TEST_BINARY_TIMEOUT="${KOK_TEST_BINARY_TIMEOUT:-14m}"
# One build of the whole workspace, with one set of features: it builds
# every package's binaries too (the dev environment's test runs the
# operators' binaries), so no separate `cargo build` compiles the
# dependencies a second time with other features. It is the build nextest
# asks cargo for, made while nextest itself may still be compiling.
phase "building the workspace and its tests"
cargo test --workspace --no-run
if ! wait "$nextest_install"; then
  cat "$CARGO_TARGET_DIR/nextest-install.log" >&2
  echo "installing cargo-nextest failed (scripts/nextest.sh)" >&2
  exit 1
fi
PATH="$(tail -n 1 "$CARGO_TARGET_DIR/nextest-install.log"):$PATH"
export PATH
cargo nextest --version
cargo nextest run --workspace --no-run

wait_node_software() {
  if ! wait "$node_software"; then
    echo "building the worker nodes' software failed (see above)" >&2
    exit 1
  fi
}

# The tests that run worker nodes' software: real workers, the dev
# environment (with the conformance suite), the real meta-cluster (its
# images), S3 storage (versitygw is built
# with them), the packages' checksums.
needs_node_software='binary_id(kube-on-kube-operator::real_workers)
  | binary_id(kube-on-kube-operator::etcd_backup)
  | binary_id(kube-on-kube-operator::etcd_quorum_loss)
  | binary_id(kube-on-kube-operator::backup_store)
  | binary_id(kok-testenv::dev_env)
  | binary_id(kok-testenv::node_runtime)
  | test(the_example_package_versions_are_what_the_script_prints)
  | test(a_tenants_huge_snapshot_manifest_is_refused_unread_and_others_converge)
  | binary_id(kube-on-kube-operator::backup_fairness)
  | binary_id(kube-on-kube-operator::meta_cluster)
  | binary_id(kube-on-kube-operator::meta_worker_removal)'

# KOK_TEST_CPU=1: each test runs under scripts/test-cpu.py, which adds up
# the CPU time of its whole process tree; the table then has a CPU-s column.
reports=target/nextest/reports
cpu_args=()
if [ "${KOK_TEST_CPU:-}" = 1 ]; then
  runner_var="CARGO_TARGET_$(rustc -vV | sed -n 's/^host: //p' | tr 'a-z-' 'A-Z_')_RUNNER"
  export "$runner_var=$PWD/scripts/test-cpu.py"
  export KOK_TEST_CPU_LOG=$PWD/$reports/cpu.tsv
  cpu_args=(--cpu "$KOK_TEST_CPU_LOG")
fi

# nextest runs no doctests; cargo does, beside the first tests.
scripts/low-priority.sh 10 cargo test --workspace --doc >"$CARGO_TARGET_DIR/doctests.log" 2>&1 &
doctests=$!

# nextest keeps its store in the workspace's target/nextest, whatever
# CARGO_TARGET_DIR says.
rm -rf "$reports" && mkdir -p "$reports"
status=0
run() {
  local name=$1
  shift
  phase "running the tests: $name"
  cargo nextest run --workspace "$@" || status=$?
  cp target/nextest/default/junit.xml "$reports/$name.xml" 2>/dev/null || true
}
if [ $# -gt 0 ]; then
  wait_node_software
  run selected "$@"
elif kill -0 "$node_software" 2>/dev/null; then
  run "without-node-software" -E "not ($needs_node_software)"
  phase "waiting for the worker nodes' software"
  wait_node_software
  run "with-node-software" -E "$needs_node_software"
else
  wait_node_software
  run all
fi
phase "doctests"
if wait "$doctests"; then
  grep -E '^test result:' "$CARGO_TARGET_DIR/doctests.log" | grep -v ' 0 passed; 0 failed' || true
else
  cat "$CARGO_TARGET_DIR/doctests.log"
  echo "the doctests failed (cargo test --workspace --doc)" >&2
  status=1
fi
trap - EXIT
phase "done"
python3 scripts/test-times.py "${cpu_args[@]}" "$reports"/*.xml || true
python3 scripts/test-times.py --failures "$reports"/*.xml || true
exit $status
