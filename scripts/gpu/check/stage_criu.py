"""Is CRIU here, with gpuckpt's plugin? The stages that dump through CRIU run only then.

A failed `criu check` often names a feature these dumps do not use; the dumps themselves then
say what fails, which is worth more on a rare GPU machine than a SKIP: it is an INFO, and the
dumps run with --no-criu-check.
"""

import os
import shutil

import helpers as h
from context import DEVNULL, STDOUT


def find_criu():
    criu = os.environ.get("GPUCKPT_CRIU") or ""
    if not criu:
        prefix = os.environ.get("GPUCKPT_CRIU_PREFIX") or "/opt/gpuckpt-criu"
        for cand in (os.path.join(prefix, "bin/criu"), shutil.which("criu") or ""):
            if cand and os.access(cand, os.X_OK):
                return cand
    return criu


def gvisor():
    """Some GPU machines run under gVisor, whose kernel (4.4.0) has none of what CRIU needs."""
    try:
        with open("/proc/version", encoding="utf-8") as f:
            version = f.read()
    except OSError:
        return False
    return "gVisor" in version or os.uname().release == "4.4.0"


def run(c):
    criu = find_criu()
    c.criu_ok = False
    c.criu_args = []
    if not c.o.do_criu:
        c.record("SKIP", "criu", "--no-criu")
    elif gvisor():
        c.record("SKIP", "criu",
                 f"this machine runs under gVisor (kernel {os.uname().release}): CRIU cannot run")
    elif not criu:
        c.record("SKIP", "criu", "CRIU is not installed here (scripts/install-criu.sh needs apt)")
    elif not os.path.isfile(os.path.join(c.plugin_dir, "gpuckpt_criu_plugin.so")):
        c.record("SKIP", "criu",
                 "the CRIU plugin was not built (no criu-plugin.h at configure time)")
    else:
        os.environ["GPUCKPT_CRIU"] = criu
        c.criu_ok = True
        log = c.path("criu-check.log")
        if c.run([criu, "check"], timeout=c.cap(30), out=log, err=STDOUT) == 0:
            c.record("PASS", "criu check", h.first_line(c.output([criu, "--version"], err=DEVNULL)))
        else:
            c.criu_args.append("--no-criu-check")
            c.record("INFO", "criu check",
                     f"fails here, dumping all the same: {h.oneline(c.tail(3, log))}")
