"""What the stages share: the options, the paths, the state found so far, and the ways to run
commands, servers, dumps and restores.

Commands run under coreutils' `timeout` (SIGTERM at the limit, as the shell version did), with
their output in the log unless redirected. A signal (the watchdog's, or the device tool's) is
acted on only between commands, as bash's trap was: a command is never left running half-killed.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import helpers as h
from summary import ME, Summary

DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT

# The test programs this check builds, carries in a bundle and runs (in this order).
GPU_TESTS = ["device_gpu_test", "kernels_binaries_test", "device_cli_test", "library_search_test"]

REMAP_NEEDS = "driver without GPU remapping (needs CUDA 13.0 / r580)"


class Stopped(BaseException):
    """A SIGINT or SIGTERM, raised between commands (BaseException: no stage may swallow it)."""


class Context:
    def __init__(self, opts, here, work, out_dir):
        self.o = opts
        self.here = here
        self.work = work
        self.s = Summary(work, out_dir, opts.budget_s)
        self.orig_ld_library_path = os.environ.get("LD_LIBRARY_PATH", "")
        self.torch_server = os.path.join(here, "scripts/gpu/torch_decoder_server.py")
        self.build = opts.build
        self.bin = self.plugin_dir = self.tests_dir = ""
        self.gpuckpt = self.server = self.roofline = ""
        self.children = []  # killed at the end
        # CUDA processes that went through a checkpoint: locked before they are killed.
        self.restored = []
        self.children_links = []  # removed at the end
        self.procs = {}  # pid -> Popen of what this check started in the background
        self.pending_signal = False
        self.cleaning = False
        self.watchdog = None
        self.pwd = os.getcwd()
        # Found by the stages, read by later ones.
        self.gpu_uuid = self.ckpt_api = self.remap = ""
        self.bw = self.d2h = self.h2d = self.tensor = self.fp32 = ""
        self.demo_pid = self.demo_sock = self.twin_pid = self.twin_sock = ""
        self.vram_bytes = self.hash_before = ""
        self.criu_ok = False
        self.criu_args = []
        self.srv_pid = self.srv_sock = self.new_pid = ""
        self.thp_restore = ""  # the THP mode to put back (stage_thp), "" if unchanged

    # ---- the summary's calls, for brevity in the stages ----

    def record(self, status, name, detail):
        self.s.record(status, name, detail)

    def say(self, text):
        self.s.say(text)

    def cap(self, s):
        return self.s.cap(s)

    def have_time(self, s, name):
        return self.s.have_time(s, name)

    def die(self, code, message):
        self.record("FAIL", ME, message)
        raise SystemExit(code)

    def path(self, name):
        return os.path.join(self.work, name)

    # ---- signals ----

    def on_signal(self, signum, frame):
        self.pending_signal = True

    def check_signal(self):
        if self.pending_signal and not self.cleaning:
            self.pending_signal = False
            raise Stopped()

    def sleep(self, s):
        time.sleep(s)
        self.check_signal()

    # ---- commands ----

    def env(self, extra):
        if not extra:
            return None
        e = dict(os.environ)
        e.update(extra)
        return e

    def py_env(self, **extra):
        """python3 keeps the machine's own libraries: a bundle's libffi & co. must not shadow
        the system's for torch."""
        return dict(LD_LIBRARY_PATH=self.orig_ld_library_path, **extra)

    def _popen(self, argv, out, err, env, stdin=None):
        """Popen, or None (and a shell's message, rc 126/127) when argv[0] cannot run."""
        sys.stdout.flush()
        sys.stderr.flush()
        files = []
        try:
            if isinstance(out, str):
                out = open(out, "wb")
                files.append(out)
            if isinstance(err, str):
                err = open(err, "wb")
                files.append(err)
            return subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=err, env=self.env(env)), 0
        except OSError as e:
            if err is not DEVNULL:
                print(f"{ME}: {argv[0]}: {e.strerror}", file=sys.stderr, flush=True)
            return None, (126 if isinstance(e, PermissionError) else 127)
        finally:
            for f in files:
                f.close()

    def run(self, argv, timeout=None, out=None, err=None, env=None):
        """argv's exit code. timeout: seconds (coreutils timeout); out/err: None (the log), a
        path (truncated), DEVNULL, or err=STDOUT."""
        argv = [str(a) for a in argv]
        if timeout is not None:
            argv = ["timeout", str(timeout)] + argv
        p, rc = self._popen(argv, out, err, env)
        if p is not None:
            rc = p.wait()
        self.check_signal()
        return rc

    def output(self, argv, timeout=None, err=None, env=None):
        """argv's stdout as $(...) gives it (trailing newlines dropped)."""
        return h.sub(self.output_raw(argv, timeout, err, env)[1])

    def output_raw(self, argv, timeout=None, err=None, env=None):
        """(exit code, stdout as printed)."""
        argv = [str(a) for a in argv]
        if timeout is not None:
            argv = ["timeout", str(timeout)] + argv
        p, rc = self._popen(argv, subprocess.PIPE, err, env)
        data = b""
        if p is not None:
            data, _ = p.communicate()
            rc = p.returncode
        self.check_signal()
        return rc, data.decode(errors="replace")

    def tail(self, n, *paths, quiet=False):
        """`tail -n N FILE...` as printed (a header per file when there are several)."""
        return self.output_raw(["tail", "-n", n, *paths], err=DEVNULL if quiet else None)[1]

    def spawn(self, argv, out, err=STDOUT, env=None, stdin=DEVNULL):
        """Starts argv in the background; its pid ("" when it could not start)."""
        p, _ = self._popen([str(a) for a in argv], out, err, env, stdin=stdin)
        if p is None:
            return ""
        self.procs[p.pid] = p
        return str(p.pid)

    def wait(self, pid):
        p = self.procs.get(_int(pid))
        if p is not None:
            p.wait()

    def alive(self, pid):
        """`kill -0 PID`. A child of this check that has ended is reaped first: a zombie would
        hold its pid, which CRIU must restore with."""
        n = _int(pid)
        if n is None or n <= 0:
            return False
        p = self.procs.get(n)
        if p is not None:
            p.poll()
        try:
            os.kill(n, 0)
            return True
        except OSError:
            return False

    def kill9(self, *pids):
        for pid in pids:
            n = _int(pid)
            if n is not None and n > 0:
                try:
                    os.kill(n, signal.SIGKILL)
                except OSError:
                    pass

    def lock_then_kill(self, pids):
        """Killing a live CUDA process right after a restore has crashed hosts on some drivers
        (NVIDIA/cuda-checkpoint#53); a locked one is safe. Best effort, in parallel, bounded."""
        lockers = []
        if self.gpuckpt and os.access(self.gpuckpt, os.X_OK):
            for pid in pids:
                if self.alive(pid):
                    lock = ["timeout", "15", self.gpuckpt, "cuda-checkpoint", "--pid", str(pid),
                            "--action", "lock", "--timeout-ms", "5000"]
                    p, _ = self._popen(lock, DEVNULL, DEVNULL, None, stdin=DEVNULL)
                    if p is not None:
                        lockers.append(p)
            for p in lockers:
                p.wait()
        for pid in pids:
            if self.alive(pid):
                self.kill9(pid)

    # ---- the servers: the CUDA demo server, its tree form, the PyTorch decoder ----

    def launch_server(self, name, kind, vram=None, *args):
        """Starts a server in the background (kind: demo or torch); await_server waits for it."""
        vram = vram or self.o.vram_gib
        # Own session: CRIU dumps it as a standalone tree, and the check is not part of it.
        session = ["setsid"] if shutil.which("setsid") else []
        sock, out, err = (self.path(f"{name}.{x}") for x in ("sock", "out", "err"))
        if kind == "torch":
            argv = ["python3", self.torch_server, "--socket", sock, "--gib", self.o.torch_gib,
                    "--seed", "7"]
            pid = self.spawn(session + argv, out, err, env=self.py_env(PYTHONUNBUFFERED="1"))
        else:
            argv = [self.server, "--socket", sock, "--vram-gib", vram, "--seed", "7", *args]
            pid = self.spawn(session + argv, out, err)
        self.children.append(pid)
        with open(self.path(f"{name}.launcher"), "w") as f:
            f.write(f"{pid}\n")

    def await_server(self, name, kind):
        """True once the server printed READY and told its pid (srv_pid, srv_sock); else a FAIL."""
        self.srv_sock = self.path(f"{name}.sock")
        launcher = h.cat(self.path(f"{name}.launcher"))
        limit = self.cap(120)
        deadline = self.s.seconds() + limit
        out = self.path(f"{name}.out")

        def ready():
            return any(line.startswith("READY ") for line in h.read_text(out).split("\n"))

        while not ready():
            if not self.alive(launcher) and not ready():
                tail = h.oneline(self.tail(5, self.path(f"{name}.err")))
                self.record("FAIL", f"{name} server", f"exited: {tail}")
                return False
            if self.s.seconds() >= deadline:
                self.record("FAIL", f"{name} server", f"printed no READY within {limit} s")
                return False
            self.sleep(0.2)
        # The server's own pid (setsid forks when it would otherwise lead a process group).
        self.srv_pid = h.info_field(self.ask_any(kind, self.srv_sock, "INFO"), "pid")
        if not self.srv_pid:
            self.record("FAIL", f"{name} server", "does not answer INFO")
            return False
        self.children.append(self.srv_pid)
        return True

    def ask_any(self, kind, sock, request):
        """A server's reply to one request ("" when none)."""
        t = self.cap(60)
        if kind == "torch":
            return self.output(["python3", self.torch_server, "--client", sock, request,
                                "--timeout", t], timeout=t, env=self.py_env())
        return self.output([self.server, "--client", sock, request, "--timeout-ms", t * 1000 - 500],
                           timeout=t)

    def ask(self, sock, request):
        return self.ask_any("demo", sock, request)

    def vram_of_pid(self, pid):
        """MiB nvidia-smi attributes to a pid ("" when not listed / no nvidia-smi)."""
        if not shutil.which("nvidia-smi"):
            return ""
        text = self.output(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                            "--format=csv,noheader,nounits"], timeout=20, err=DEVNULL)
        out = []
        for line in text.split("\n"):
            f = re.split(r", *", line)
            if f[0] and _same_number(f[0], pid):
                out.append(f[1] if len(f) > 1 else "")
        return h.sub("\n".join(out))

    # ---- CRIU: dumps and restores through gpuckpt ----

    def criu_dump(self, tag, pid, ckpt, *args):
        """gpuckpt dump of pid to ckpt (extra dump args after); a PASS or a FAIL."""
        t0 = h.now()
        js, err = self.path(f"{tag}-dump.json"), self.path(f"{tag}-dump.err")
        argv = [self.gpuckpt, "--json", "dump", "--pid", pid, "-o", ckpt, *self.criu_args, *args]
        if self.run(argv, timeout=self.cap(150), out=js, err=err) == 0:
            self.record("PASS", f"{tag} dump", f"{h.json_get(js, 'image_bytes')} image bytes, "
                        f"gpu={h.json_get(js, 'gpu')} ({h.elapsed(t0)} s)")
            h.print_timeline(js)
            return True
        self.record("FAIL", f"{tag} dump", h.oneline(self.tail(5, err)))
        return False

    def wait_gone(self, pid):
        """Reaps/awaits pid, so that CRIU can restore with it."""
        for _ in range(100):
            if not self.alive(pid):
                return True
            self.sleep(0.1)
        return False

    def criu_restore(self, tag, ckpt, sock, request, *args):
        """gpuckpt restore of ckpt, probed on sock with request; sets new_pid on a PASS."""
        t0 = h.now()
        js, err = self.path(f"{tag}-restore.json"), self.path(f"{tag}-restore.err")
        self.new_pid = ""
        argv = [self.gpuckpt, "--json", "restore", ckpt, "--probe", f"unix:{sock}",
                "--request", request, *self.criu_args, *args]
        if self.run(argv, timeout=self.cap(150), out=js, err=err) == 0:
            self.new_pid = h.json_get(js, "pid")
            self.children.append(self.new_pid)
            self.restored.append(self.new_pid)
            self.record("PASS", f"{tag} restore", f"pid {self.new_pid}, first answer "
                        f"'{h.json_get(js, 'first_answer')}' ({h.elapsed(t0)} s)")
            h.print_timeline(js)
            return True
        self.record("FAIL", f"{tag} restore", h.oneline(self.tail(5, err)))
        return False

    def save_criu_logs(self, tag):
        files = ("dump.json", "dump.err", "restore.json", "restore.err")
        text = f"==== {tag}\n" + "".join(h.read_text(self.path(f"{tag}-{n}")) for n in files)
        self.s.append("criu.log", text)

    def start_faulted_dump(self, pause, mark, pid, ckpt, out, *args):
        """gpuckpt dump in the background, told to stop at the fault point pause (and touch
        mark there); its pid."""
        argv = [self.gpuckpt, "dump", "--pid", pid, "-o", ckpt, *args, *self.criu_args]
        return self.spawn(argv, out, env={"GPUCKPT_FAULT_PAUSE": pause, "GPUCKPT_FAULT_MARK": mark})

    def await_mark(self, mark, g):
        """Waits (at most 60 s of the budget) for gpuckpt g to reach its fault point."""
        limit = self.s.seconds() + self.cap(60)
        while not (os.path.exists(mark) or not self.alive(g) or self.s.seconds() >= limit):
            self.sleep(0.1)

    def await_guard(self, guard):
        """Waits (at most 90 s of the budget) for the guard to finish its recovery."""
        limit = self.s.seconds() + self.cap(90)
        while self.alive(guard) and self.s.seconds() < limit:
            self.sleep(0.1)


def _int(pid):
    try:
        return int(str(pid).strip())
    except ValueError:
        return None


def _same_number(a, b):
    """awk's `$1 == p`: numerically when both are numbers, else as strings."""
    try:
        return float(a) == float(b)
    except ValueError:
        return a == str(b)
