#!/usr/bin/env python3
"""The GPU check's runner (scripts/gpu-check.sh execs it; docs/GPU.md): the command line, the
log, the signals and the watchdog, the stages in order, and the cleanup that locks every CUDA
process that went through a checkpoint before it is killed.

Exit: 0 all checks passed (some may be skipped), 1 a check failed, 2 usage, 7 no GPU.
Standard library only: the GPU machine has python3, and nothing can be installed there.
"""

import os
import re
import signal
import sys
import tempfile
import threading
import traceback

import helpers as h
import stage_bench_dump
import stage_build
import stage_criu
import stage_cuda
import stage_demo_criu
import stage_demo_server
import stage_devices
import stage_dump_killed
import stage_roofline
import stage_tests
import stage_thp
import stage_torch
import stage_tree
from context import Context, Stopped
from summary import ME

USAGE = """\
End-to-end check of gpuckpt on a machine with an NVIDIA GPU and its driver (docs/GPU.md):
builds what it needs, lists the GPUs, measures the roofline ceilings, starts the CUDA demo
server with several GiB of VRAM state, checkpoints that VRAM to host memory and back through
the CUDA driver API (no CRIU needed) and checks the GPU-side hash of the whole VRAM state is
unchanged; then, where CRIU works, a PyTorch decoder dumped and restored mid-conversation
(scripts/gpu/torch_decoder_server.py) and a full `gpuckpt dump` + `gpuckpt restore` of the
demo server. Prints a summary (rewritten after every check) and exits non-zero if any check
failed. With $OUT set: gpu-check.log, summary.txt and results.tar.gz (the JSON results and
logs) go there.

  scripts/gpu-check.sh                        # build in build-gpu-check/, then check
  scripts/gpu-check.sh --make-bundle gpu-bundle   # on a dev machine (no GPU needed): build
                                              # a self-contained bundle, inside the repository
                                              # (git-ignored), for a GPU machine that lacks
                                              # the build dependencies
  scripts/gpu-check.sh --bundle gpu-bundle    # on the GPU machine: check with that bundle
Options: --build-dir DIR, --vram-gib N (default 4), --torch-gib N (default 1.5), --no-criu,
--no-torch, --no-tests, --budget-s S (default 330: the whole check ends by then), --keep,
--jobs N, --bench-dump SIZE (also `gpuckpt bench dump` of a SIZE demo server, 3 runs, on the
disk of the repository: the storage path on this machine's cores)
"""

# After the build (or the bundle), in this order.
STAGES = [stage_devices, stage_roofline, stage_demo_server, stage_cuda, stage_thp, stage_criu,
          stage_torch, stage_demo_criu, stage_dump_killed, stage_tree, stage_tests,
          stage_bench_dump]

VALUE_OPTIONS = {"--build-dir": "build", "--bundle": "bundle", "--make-bundle": "make_bundle",
                 "--vram-gib": "vram_gib", "--torch-gib": "torch_gib", "--budget-s": "budget_s",
                 "--jobs": "jobs", "--bench-dump": "bench_size"}
FLAGS = {"--no-criu": ("do_criu", False), "--no-torch": ("do_torch", False),
         "--no-tests": ("do_tests", False), "--keep": ("keep", True)}


class Options:
    def __init__(self, here, env):
        self.build = env.get("GPUCKPT_BUILD_DIR") or os.path.join(here, "build-gpu-check")
        self.bundle = ""
        self.make_bundle = ""
        self.vram_gib = "4"
        self.torch_gib = "1.5"
        self.do_criu = self.do_torch = self.do_tests = True
        self.keep = False
        self.jobs = "16"
        self.bench_size = ""
        # The device machine gives one command 10 minutes; the whole check must end well
        # within, with its summary written.
        self.budget_s = "330"


def usage(code):
    sys.stderr.write(USAGE)
    raise SystemExit(code)


def fail_usage(message):
    print(f"{ME}: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_args(argv, here, env=None):
    """The options; SystemExit(0) after -h, SystemExit(2) on a usage error (message on stderr)."""
    o = Options(here, os.environ if env is None else env)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in VALUE_OPTIONS:
            if i + 1 >= len(argv) or argv[i + 1] == "":
                fail_usage(f"{a} needs a value")
            setattr(o, VALUE_OPTIONS[a], argv[i + 1])
            i += 1
        elif a in FLAGS:
            setattr(o, *FLAGS[a])
        elif a in ("-h", "--help"):
            usage(0)
        else:
            print(f"{ME}: unknown argument {a}", file=sys.stderr)
            usage(2)
        i += 1
    if not re.fullmatch(r"[0-9.]+", o.vram_gib):
        fail_usage("--vram-gib needs a number")
    if not re.fullmatch(r"[0-9.]+", o.torch_gib):
        fail_usage("--torch-gib needs a number")
    if not re.fullmatch(r"[0-9]+", o.budget_s):
        fail_usage("--budget-s needs whole seconds")
    o.budget_s = int(o.budget_s)
    return o


def logical_cwd():
    """The working directory as the shell names it ($PWD: symlinks kept), for the paths shown."""
    pwd = os.environ.get("PWD", "")
    try:
        if pwd and os.path.isabs(pwd) and os.path.samefile(pwd, "."):
            return pwd
    except OSError:
        pass
    return os.getcwd()


def start_log(log):
    """Everything this check and its commands print goes to the terminal and to log, as through
    tee; the log is open before anything is printed (a short run removes its work dir early)."""
    r, w = os.pipe()
    term = os.dup(1)
    logf = open(log, "ab", buffering=0)

    def pump():
        to_term = True
        while True:
            data = os.read(r, 65536)
            if not data:
                break
            try:
                logf.write(data)
            except OSError:  # a full disk must not block the check on a full pipe
                pass
            if to_term:
                try:
                    os.write(term, data)
                except OSError:  # the terminal went away: the log goes on
                    to_term = False
        logf.close()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(w, 1)
    os.dup2(w, 2)
    os.close(w)
    sys.stdout.reconfigure(line_buffering=True)
    return t


def check(c):
    o = c.o
    if o.make_bundle:
        dest = o.make_bundle if os.path.isabs(o.make_bundle) else f"{c.pwd}/{o.make_bundle}"
        c.s.deadline = c.s.seconds() + 86400  # no device budget while bundling
        stage_build.make_bundle(c, dest)
        return 1 if c.s.failures else 0
    # A backstop behind the per-command limits: stops the check 20 s past its budget.
    c.watchdog = threading.Timer(o.budget_s + 20, os.kill, (os.getpid(), signal.SIGTERM))
    c.watchdog.daemon = True
    c.watchdog.start()
    c.say(f"gpuckpt GPU check: repo {c.here}, work dir {c.work}, VRAM state {o.vram_gib} GiB, "
          f"budget {o.budget_s} s")
    stage_build.run(c)
    c.gpuckpt = os.path.join(c.bin, "gpuckpt")
    c.server = os.path.join(c.bin, "gpuckpt-cuda-demo-server")
    c.roofline = os.path.join(c.bin, "gpuckpt-roofline-gpu")
    for stage in STAGES:
        stage.run(c)
    c.check_signal()
    return 1 if c.s.failures else 0


def cleanup(c, log):
    c.cleaning = True  # a second signal must not cut the locking short
    if c.watchdog:
        c.watchdog.cancel()
    c.lock_then_kill(c.restored)
    stage_thp.put_back(c)
    for p in c.children:
        if c.alive(p):
            c.kill9(p)
    for link in c.children_links:
        try:
            os.unlink(link)
        except OSError:
            pass
    if c.s.results:
        c.s.print_final()
    if c.o.keep:
        print(f"{ME}: kept {c.work}")
    else:
        h.rm_rf(c.work)
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    log.join()


def main(argv):
    pwd = logical_cwd()
    here = os.path.normpath(os.path.join(pwd, os.path.dirname(__file__), "..", "..", ".."))
    o = parse_args(argv, here)
    work = tempfile.mkdtemp(prefix="gpuckpt-gpu-check.", dir=os.environ.get("TMPDIR") or "/tmp")
    out_dir = os.environ.get("OUT", "")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    log = start_log(os.path.join(out_dir or work, "gpu-check.log"))
    c = Context(o, here, work, out_dir)
    c.pwd = pwd
    signal.signal(signal.SIGINT, c.on_signal)
    signal.signal(signal.SIGTERM, c.on_signal)
    try:
        rc = check(c)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Stopped:
        c.record("FAIL", ME, f"stopped by a signal at {c.s.seconds()} s (budget {o.budget_s} s)")
        rc = 130
    except Exception as e:  # a bug here must still leave no CUDA process unlocked, and a summary
        traceback.print_exc()
        c.record("FAIL", ME, f"internal error: {type(e).__name__}: {e}")
        rc = 1
    cleanup(c, log)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
