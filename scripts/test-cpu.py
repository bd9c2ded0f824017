#!/usr/bin/env python3
"""A cargo target runner that measures the CPU time of a test's whole tree.

    CARGO_TARGET_<TRIPLE>_RUNNER=scripts/test-cpu.py  (scripts/test.sh sets
    it with KOK_TEST_CPU=1; the lines go to $KOK_TEST_CPU_LOG)

On 2 cores the test run is bound by CPU, not by how long each test waits:
this says what each test costs the machine. It runs the test binary as a
child subreaper (PR_SET_CHILD_SUBREAPER), so that what the test starts and
leaves (API servers, etcd, kubelets, test hosts) is reaped here and counted
in this process's children's CPU time, then appends one line:

    CPU-s  user-s  system-s  wall-s  binary  test

Kernel work on behalf of nobody in the tree (network namespaces torn down,
softirqs) is not counted.
"""

import ctypes
import os
import resource
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.execv(sys.argv[1], sys.argv[1:])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    status = 0
    while True:
        try:
            reaped, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if reaped == pid:
            status = st
            break
    # What the test left is killed by its parent-death signal: a moment to
    # reap it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if reaped == 0:
            time.sleep(0.05)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    binary = os.path.basename(sys.argv[1]).rsplit("-", 1)[0]
    test = next((a for a in sys.argv[2:] if not a.startswith("-")), "")
    if "--list" not in sys.argv:
        line = (
            f"{ru.ru_utime + ru.ru_stime:.1f}\t{ru.ru_utime:.1f}\t{ru.ru_stime:.1f}\t"
            f"{time.monotonic() - started:.1f}\t{binary}\t{test}\n"
        )
        with open(os.environ.get("KOK_TEST_CPU_LOG", "test-cpu.tsv"), "a") as f:
            f.write(line)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
