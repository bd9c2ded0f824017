#!/usr/bin/env bash
# Runs a command in a session of its own at a low CPU priority that holds:
#
#   scripts/low-priority.sh NICE COMMAND [ARG...]
#
# A session of its own lets the caller stop the command and everything it
# started at once (kill -- -PID; PID stays the command's own). But with the
# kernel's autogroups (/proc/sys/kernel/sched_autogroup_enabled, on by
# default), each session is one group that the scheduler weighs as much as
# any other, whatever `nice` says inside it: a background build started
# with `setsid nice -n 19` took a whole core of two from the tests beside
# it. So the session's own autogroup gets the nice value too
# (/proc/self/autogroup, where the kernel has it), then the command.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
exec setsid bash -c 'echo "$0" > /proc/self/autogroup 2>/dev/null || true; exec nice -n "$0" "$@"' "$@"
