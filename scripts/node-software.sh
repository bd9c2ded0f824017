#!/usr/bin/env bash
# Builds, or finds in the cache, the software of real worker nodes that the
# tests run: the OCI registry and crane (scripts/registry-bins.sh), the node
# artifacts — containerd, runc, the CNI plugins, crictl, the kubelet
# (scripts/node-artifacts.sh) — and the images (scripts/node-images.sh; needs
# root), with the images of the upstream conformance suite and those a
# business control plane runs on a real meta-cluster, and the suite
# itself (scripts/testenv-bins.sh --e2e: e2e.test and ginkgo), which
# the dev environment's test runs a subset of; and the backup tests'
# S3 server and etcdutl (scripts/backup-bins.sh). With a warm cache it takes a
# second; from cold, minutes (docs/testing.md lists them).
#
# Each script's output goes to LOG_DIR/<script>.log; its progress lines
# ("[node-artifacts] building containerd ...") and one summary line per script
# are printed, whole lines only, so they stay readable beside a cargo build's
# output. A failing script's last log lines are printed and the exit status is
# not 0. Everything runs at the lowest CPU priority: beside a build it only
# takes the time the build leaves idle (scripts/test.sh, .ci/run).
#
# Runs started together build once (each script holds a lock on its cache
# directory while it builds), so a second run waits for the first.
#
#   scripts/node-software.sh [LOG_DIR]     # default target/node-software-logs
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
logs=${1:-${CARGO_TARGET_DIR:-$here/../target}/node-software-logs}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)

for step in registry-bins.sh backup-bins.sh node-artifacts.sh "node-images.sh --e2e --meta" "testenv-bins.sh --e2e"; do
  read -r script args <<<"$step"
  log="$logs/${script%.sh}.log"
  t0=$(date +%s)
  # The script's last output line is its cache directory.
  set +e
  # shellcheck disable=SC2086 # the arguments are words
  nice -n 19 "$here/$script" $args 2>&1 </dev/null | tee "$log" | grep --line-buffered -E '^\[[a-z-]+\] '
  status=${PIPESTATUS[0]}
  set -e
  took=$(($(date +%s) - t0))
  if [ "$status" != 0 ]; then
    echo "node software: $script failed after ${took}s (exit $status); the end of $log:" >&2
    tail -n 40 "$log" | sed 's/^/    /' >&2
    exit 1
  fi
  echo "node software: $script ready after ${took}s: $(tail -n 1 "$log")"
done
