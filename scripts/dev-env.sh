#!/usr/bin/env bash
# The product doing its job on this machine, until Ctrl-C: a meta-cluster
# whose Pods run as real processes, the operators installed into it with the
# project's Helm chart, the example Clusters as working business clusters,
# the example Machines as real worker nodes (containerd, runc, CNI plugins,
# kubelet) on SSH test hosts, and the example CanaryRelease rolled out on
# them. Kubeconfigs go to .kok-dev/ in the repository.
#
# First it installs the Debian packages the test hosts need
# (scripts/testhost-deps.sh; needs root), builds the upstream binaries
# (scripts/testenv-bins.sh) and the worker nodes' software
# (scripts/node-software.sh: registry, node artifacts, images), all cached
# outside the repository (a warm cache takes a second), and the workspace's
# binaries. Arguments go to kok-dev-env (see its --help); relative paths in
# them are relative to the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
# Cargo's target directory is cached outside the repository, as
# scripts/test.sh keeps it, so the two share their builds.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}/target}

if [ -x scripts/testhost-deps.sh ]; then
  scripts/testhost-deps.sh
fi
KOK_TESTENV_BIN_DIR=$(scripts/testenv-bins.sh | tail -n 1)
export KOK_TESTENV_BIN_DIR
scripts/node-software.sh "$CARGO_TARGET_DIR/node-software-logs"
cargo build --bin kube-on-kube-operator --bin node-operator --bin kokctl --bin kubectl-kok \
  --bin kok-dev-env --bin kok-pod-exec --bin kok-testhost
target=$CARGO_TARGET_DIR/debug
export KOK_DEV_OPERATORS_DIR=${KOK_DEV_OPERATORS_DIR:-$target}
exec "$target/kok-dev-env" "$@"
