"""The GPU test programs, each with what is left of the budget (at most 120 s); a
missing one is a FAIL: the check would be incomplete."""

import os
import re

import helpers as h
from context import GPU_TESTS, STDOUT

OK = re.compile(r"^\[       OK \]")
SKIPPED = re.compile(r"^\[  SKIPPED \] .* \([0-9]* ms\)$")
FAILED = re.compile(r"^\[  FAILED  \]|Failure|Timeout")


def run(c):
    if not c.o.do_tests:
        return
    for t in GPU_TESTS:
        prog = os.path.join(c.tests_dir, t)
        if not os.access(prog, os.X_OK):
            c.record("FAIL", t, "not built (GoogleTest missing?): the check is incomplete")
            continue
        if not c.have_time(20, t):
            continue
        log = c.path(f"{t}.log")
        t0 = h.now()
        rc = c.run([prog], timeout=c.cap(120), out=log, err=STDOUT)
        lines = h.read_text(log).split("\n")
        if rc == 0:
            passed = sum(1 for line in lines if OK.search(line))
            skipped = sum(1 for line in lines if SKIPPED.search(line))
            c.record("PASS", t, f"{passed} passed, {skipped} skipped ({h.elapsed(t0)} s)")
        else:
            matched = [line for line in lines if FAILED.search(line)][:5]
            failed = "".join(line + " " for line in matched)
            c.record("FAIL", t, f"{failed} (exit or timeout after {h.elapsed(t0)} s)")
        with open(log, "rb") as f:
            c.s.append("tests.log", f.read())
