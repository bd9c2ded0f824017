#!/usr/bin/env bash
# Installs what the SSH test hosts of kok-testenv need (Debian packages; needs
# root): sshd, the ssh client and ssh-keygen, `ip`, `ps`/`pgrep`, and curl,
# which tests run on the hosts to download from the artifact server.
# Idempotent: installs only what is missing, running `apt-get update` only then.
set -euo pipefail

declare -A provides=(
  [openssh-server]=/usr/sbin/sshd
  [openssh-client]=/usr/bin/ssh
  [iproute2]=/usr/sbin/ip
  [procps]=/usr/bin/pgrep
  [curl]=/usr/bin/curl
)
missing=()
for package in "${!provides[@]}"; do
  [ -x "${provides[$package]}" ] || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # The package's own start of sshd fails harmlessly where no init system runs.
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
