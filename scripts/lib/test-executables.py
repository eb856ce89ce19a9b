#!/usr/bin/env python3
"""Reads `cargo test --no-run --message-format=json…` from stdin and prints
the executables scripts/test.sh runs:

  bin            the `targetlease` binary the build linked (not a test)
  test NAME      the test executable of the integration-test target NAME
  others NAME    every other test executable (unit tests, integration
                 tests, benches in test mode, other members' unit tests),
                 one "LABEL PATH" per line, sorted by label

Exits non-zero, naming what is missing, when the build did not make it."""
import json
import sys


def artifacts():
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
            yield msg


def label(msg):
    """An integration test by its name; the product's unit tests by their
    kind (`lib`, `bin`, `bench`); another member's unit tests by its name."""
    kind, name = msg["target"]["kind"][0], msg["target"]["name"]
    return name if kind == "test" or name != "targetlease" else kind


def main(argv):
    mode = argv[1] if len(argv) > 1 else ""
    found = list(artifacts())
    if mode == "bin":
        bins = [m["executable"] for m in found
                if not m["profile"]["test"] and m["target"]["name"] == "targetlease"
                and "bin" in m["target"]["kind"]]
        if not bins:
            sys.exit("test-executables: the build linked no targetlease binary")
        print(bins[-1])
    elif mode == "test" and len(argv) == 3:
        exes = [m["executable"] for m in found
                if m["profile"]["test"] and "test" in m["target"]["kind"]
                and m["target"]["name"] == argv[2]]
        if not exes:
            sys.exit(f"test-executables: the build made no test target {argv[2]}")
        print(exes[-1])
    elif mode == "others" and len(argv) == 3:
        seen, lines = set(), []
        for m in found:
            if not m["profile"]["test"] or m["executable"] in seen:
                continue
            if "test" in m["target"]["kind"] and m["target"]["name"] == argv[2]:
                continue
            seen.add(m["executable"])
            lines.append((label(m), m["executable"]))
        if not lines:
            sys.exit("test-executables: the build made no other test executable")
        for name, exe in sorted(lines):
            print(name, exe)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
