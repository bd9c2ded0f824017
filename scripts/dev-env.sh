#!/usr/bin/env bash
# Runs both operators against a local meta-cluster and business cluster (the
# test environment's real upstream components) with examples/ applied, until
# Ctrl-C. Kubeconfigs and operator logs go to .kok-dev/ in the repository.
#
# Builds the upstream binaries once (cached; see scripts/testenv-bins.sh) and
# the workspace's binaries. Arguments go to kok-dev-env (see its --help);
# relative paths in them are relative to the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."

KOK_TESTENV_BIN_DIR=$(scripts/testenv-bins.sh | tail -n 1)
export KOK_TESTENV_BIN_DIR
cargo build --bin kube-on-kube-operator --bin node-operator --bin kokctl --bin kubectl-kok --bin kok-dev-env
target=${CARGO_TARGET_DIR:-target}/debug
export KOK_DEV_OPERATORS_DIR=${KOK_DEV_OPERATORS_DIR:-$target}
exec "$target/kok-dev-env" "$@"
