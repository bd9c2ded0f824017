#!/usr/bin/env bash
# Installs ansible-core and Mitogen (its strategy plugins, the peer Ansible
# users run for speed) from PyPI into a virtualenv outside the repository and
# prints the path of its ansible-playbook. Idempotent.
set -euo pipefail
ANSIBLE_CORE_VERSION=${ANSIBLE_CORE_VERSION:-2.19.14}
MITOGEN_VERSION=${MITOGEN_VERSION:-0.3.54}
root=${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}
venv="$root/ansible-core-$ANSIBLE_CORE_VERSION"
if [ ! -x "$venv/bin/ansible-playbook" ]; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet "ansible-core==$ANSIBLE_CORE_VERSION" >&2
fi
if [ "$("$venv/bin/python3" -c 'import importlib.metadata as m; print(m.version("mitogen"))' 2>/dev/null)" != "$MITOGEN_VERSION" ]; then
  "$venv/bin/pip" install --quiet "mitogen==$MITOGEN_VERSION" >&2
fi
echo "$venv/bin/ansible-playbook"
