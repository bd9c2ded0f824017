#!/usr/bin/env bash
# Installs ansible-core from PyPI into a virtualenv outside the repository and
# prints the path of its ansible-playbook. Idempotent.
set -euo pipefail
ANSIBLE_CORE_VERSION=${ANSIBLE_CORE_VERSION:-2.19.14}
root=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
venv="$root/ansible-core-$ANSIBLE_CORE_VERSION"
if [ ! -x "$venv/bin/ansible-playbook" ]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet "ansible-core==$ANSIBLE_CORE_VERSION" >&2
fi
echo "$venv/bin/ansible-playbook"
