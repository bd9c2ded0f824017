#!/usr/bin/env python3
"""Prints a table of each test binary's time from nextest's JUnit reports.

    scripts/test-times.py REPORT.xml [REPORT.xml ...]
    scripts/test-times.py --failures REPORT.xml [REPORT.xml ...]

One row per test binary, costliest first: its tests, how many failed, its
span (first start to last end, when the report has start times: with tests
side by side it includes waits for a test group), the sum of its tests'
times, and its longest test. The budget (docs/testing.md) is six minutes of
test time per binary; a binary whose tests add up to more is marked.

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


def main(paths):
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
    print(f"{'test binary':<{width}}  tests  failed    span s   sum s  longest test")
    total_tests = total_failed = 0
    total_sum = 0.0
    for name, b, span in rows:
        total_tests += b["tests"]
        total_failed += b["failed"]
        total_sum += b["sum"]
        shown = span if span is not None else b["sum"]
        mark = "  OVER BUDGET" if b["sum"] > BUDGET else ""
        longest, longest_s = b["longest"]
        print(
            f"{name:<{width}}  {b['tests']:>5}  {b['failed']:>6}  "
            f"{shown:>8.1f}  {b['sum']:>6.1f}  {longest} ({longest_s:.1f} s){mark}"
        )
    print(f"{len(rows)} binaries, {total_tests} tests, {total_failed} failed, {total_sum:.0f} test-seconds")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--failures"]:
        failures(sys.argv[2:])
    else:
        main(sys.argv[1:])
