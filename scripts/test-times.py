#!/usr/bin/env python3
"""Prints a table of each test binary's time from nextest's JUnit reports.

    scripts/test-times.py REPORT.xml [REPORT.xml ...]
    scripts/test-times.py --failures REPORT.xml [REPORT.xml ...]
    scripts/test-times.py --cpu CPU.tsv REPORT.xml [REPORT.xml ...]

One row per test binary, costliest first: its tests, how many failed, its
span (first start to last end, when the report has start times: with tests
side by side it includes waits for a test group), the sum of its tests'
times, and its longest test. The budget (docs/testing.md) is six minutes of
test time per binary; a binary whose tests add up to more is marked. With
--cpu, also the CPU seconds its tests' process trees used, from the lines
scripts/test-cpu.py wrote (KOK_TEST_CPU=1 scripts/test.sh), and the sum:
on 2 cores a run cannot end sooner than half of it.

With --failures it prints instead, for each failed test, its name and the
few lines that say why (the panic and its message, or how it ended): a
digest short enough to end a long CI log with.
"""

import sys
import xml.etree.ElementTree as ET
from datetime import datetime

BUDGET = 360.0


def parse_time(text):
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


FAILURE_LINES = 6


def cases(paths):
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"test-times: {path}: {e}", file=sys.stderr)
            continue
        yield from root.iter("testcase")


def why(case):
    """The lines of a failed case's output that say why it failed."""
    failure = case.find("failure")
    if failure is None:
        failure = case.find("error")
    output = "\n".join(
        (e.text or "") for e in [case.find("system-err"), case.find("system-out")] if e is not None
    ).splitlines()
    for i, line in enumerate(output):
        if "panicked at" in line:
            reason = []
            for text in output[i : i + FAILURE_LINES]:
                if text.startswith("stack backtrace") or text.startswith("note: "):
                    break
                reason.append(text)
            return reason
    message = (failure.get("message") or "").strip() if failure is not None else ""
    tail = [l for l in output if l.strip()][-(FAILURE_LINES - 1) :]
    return ([message] if message else []) + tail


def failures(paths):
    failed = [c for c in cases(paths) if c.find("failure") is not None or c.find("error") is not None]
    if not failed:
        return
    print(f"{len(failed)} failed:")
    for case in failed:
        print(f"FAILED {case.get('classname') or '?'} {case.get('name', '')}")
        for line in why(case):
            print(f"    {line[:300]}")


def cpu_seconds(path):
    """CPU seconds per binary name (its file name without the hash)."""
    per = {}
    if not path:
        return per
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        print(f"test-times: {path}: {e}", file=sys.stderr)
        return per
    for line in lines:
        fields = line.split("\t")
        if len(fields) >= 6:
            per[fields[4]] = per.get(fields[4], 0.0) + float(fields[0])
    return per


def main(paths, cpu_path=None):
    cpu = cpu_seconds(cpu_path)
    binaries = {}
    for case in cases(paths):
        binary = case.get("classname") or "?"
        took = float(case.get("time") or 0)
        start = parse_time(case.get("timestamp"))
        failed = case.find("failure") is not None or case.find("error") is not None
        b = binaries.setdefault(
            binary, {"tests": 0, "failed": 0, "sum": 0.0, "longest": ("", 0.0), "spans": []}
        )
        b["tests"] += 1
        b["failed"] += int(failed)
        b["sum"] += took
        if took > b["longest"][1]:
            b["longest"] = (case.get("name", ""), took)
        if start is not None:
            b["spans"].append((start, start + took))
    if not binaries:
        print("test-times: no test cases in the reports")
        return
    rows = []
    for name, b in binaries.items():
        span = None
        if b["spans"]:
            span = max(e for _, e in b["spans"]) - min(s for s, _ in b["spans"])
        rows.append((name, b, span))
    rows.sort(key=lambda r: -r[1]["sum"])
    width = max(len(r[0]) for r in rows)
    print()
    cpu_head = "   CPU-s" if cpu else ""
    print(f"{'test binary':<{width}}  tests  failed    span s   sum s{cpu_head}  longest test")
    total_tests = total_failed = 0
    total_sum = 0.0
    for name, b, span in rows:
        total_tests += b["tests"]
        total_failed += b["failed"]
        total_sum += b["sum"]
        shown = span if span is not None else b["sum"]
        mark = "  OVER BUDGET" if b["sum"] > BUDGET else ""
        longest, longest_s = b["longest"]
        # The binary's file name: "crate::name" with dashes as underscores.
        used = cpu.get(name.split("::")[-1].replace("-", "_")) if cpu else None
        cpu_col = (f"  {used:>6.1f}" if used is not None else f"  {'':>6}") if cpu else ""
        print(
            f"{name:<{width}}  {b['tests']:>5}  {b['failed']:>6}  "
            f"{shown:>8.1f}  {b['sum']:>6.1f}{cpu_col}  {longest} ({longest_s:.1f} s){mark}"
        )
    print(f"{len(rows)} binaries, {total_tests} tests, {total_failed} failed, {total_sum:.0f} test-seconds")
    if cpu:
        print(f"{sum(cpu.values()):.0f} CPU-seconds in the tests' process trees")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--failures"]:
        failures(sys.argv[2:])
    elif sys.argv[1:2] == ["--cpu"] and len(sys.argv) > 2:
        main(sys.argv[3:], sys.argv[2])
    else:
        main(sys.argv[1:])
