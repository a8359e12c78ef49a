"""A real workload this project did not write: a PyTorch decoder
(scripts/gpu/torch_decoder_server.py) dumped and restored mid-conversation three ways (plain,
--gpu-map, --leave-running), each continued by a turn whose greedy tokens and whole KV cache must
equal an uninterrupted reference's; then the transient figures (cold start, restore, migration)
and `gpuckpt report` of them."""

import json
import os

import helpers as h
from context import DEVNULL, REMAP_NEEDS


class Torch:
    def __init__(self, c):
        self.c = c
        self.pid = self.sock = self.ref_sock = self.last_turn = ""

    def say(self, turn):
        """One conversation turn on both servers; False when they differ."""
        c = self.c
        x = c.ask_any("torch", self.sock, f"SAY 12 {turn}")
        y = c.ask_any("torch", self.ref_sock, f"SAY 12 {turn}")
        if x and x == y and x.split(" ", 1)[0] == "OK":
            self.last_turn = x
            return True
        self.last_turn = f"server '{x}' vs reference '{y}'"
        return False

    def state_equal(self):
        c = self.c
        return c.ask_any("torch", self.sock, "STATE") == c.ask_any("torch", self.ref_sock, "STATE")

    def transient_figures(self):
        """The three wall-clock numbers of the mission for this decoder, beside the ceilings
        measured above: a cold start (python, torch and the model from nothing to the first
        answer), a restore from a checkpoint, and a migration; then `gpuckpt report` puts them
        side by side. The conversation must go on exactly after all of it (the restore's last
        copy is kept, then migrated)."""
        c = self.c
        b = c.path("bench")
        os.makedirs(b, exist_ok=True)
        ok = True
        py = ["env", f"LD_LIBRARY_PATH={c.orig_ld_library_path}", "PYTHONUNBUFFERED=1", "python3",
              c.torch_server]

        def fail_tail(name, stem):
            c.record("FAIL", name, h.oneline(c.tail(3, os.path.join(b, f"{stem}.err"))))

        argv = [c.gpuckpt, "--json", "bench", "coldstart", "--runs", "2",
                "--probe", f"unix:{b}/cold.sock", "--request", "PING", "--probe-timeout", "80",
                "--", *py, "--socket", f"{b}/cold.sock", "--gib", c.o.torch_gib, "--seed", "7"]
        if c.run(argv, timeout=c.cap(90), out=f"{b}/coldstart.json",
                 err=f"{b}/coldstart.err") != 0:
            return fail_tail("torch coldstart", "coldstart")
        if not c.criu_dump("bench", self.pid, f"{b}/torch.ckpt"):
            return
        if not c.wait_gone(self.pid):
            c.record("FAIL", "torch bench", f"pid {self.pid} still there after the dump")
            return
        probe = ["--probe", f"unix:{self.sock}", "--request", "PING", *c.criu_args]
        # CRIU's one copy path first (--copy-streams 1), then its default streams (half the
        # CPUs), in the same run: docs/CRIU.md, "Parallel copy".
        argv = [c.gpuckpt, "--json", "bench", "restore", f"{b}/torch.ckpt", "--runs", "1",
                "--copy-streams", "1", *probe]
        if c.run(argv, timeout=c.cap(60), out=f"{b}/restore-1.json",
                 err=f"{b}/restore-1.err") != 0:
            return fail_tail("torch bench restore (one stream)", "restore-1")
        argv = [c.gpuckpt, "--json", "bench", "restore", f"{b}/torch.ckpt", "--runs", "2", "--keep",
                *probe]
        if c.run(argv, timeout=c.cap(60), out=f"{b}/restore.json", err=f"{b}/restore.err") != 0:
            return fail_tail("torch bench restore", "restore")
        c.record("INFO", "torch copy streams", "; ".join(
            f"{what}: {copy_figures(f'{b}/{stem}.json')}"
            for what, stem in (("one stream", "restore-1"), ("default streams", "restore"))))
        argv = [c.gpuckpt, "--json", "bench", "migrate", "--pid", self.pid, "--to", f"{b}/migrate",
                *probe]
        if c.run(argv, timeout=c.cap(60), out=f"{b}/migrate.json", err=f"{b}/migrate.err") != 0:
            return fail_tail("torch bench migrate", "migrate")
        line = "".join(f"{k} {h.json_get(f'{b}/{k}.json', 'summary.median_seconds')} s "
                       f"(median of {h.json_get(f'{b}/{k}.json', 'summary.runs')}), "
                       for k in ("coldstart", "restore", "migrate"))
        c.record("INFO", "torch transient", f"{line}decoder of {c.o.torch_gib} GiB bf16 with its "
                 "KV cache, to the first answer")
        f = ["--coldstart", f"{b}/coldstart.json", "--restore", f"{b}/restore.json",
             "--migrate", f"{b}/migrate.json"]
        cli_roofline = c.path("cli-roofline.json")
        if os.path.isfile(cli_roofline) and os.path.getsize(cli_roofline) > 0:
            f += ["--roofline", cli_roofline]
        if (c.run([c.gpuckpt, "--json", "report", *f], timeout=c.cap(30), out=f"{b}/report.json",
                  err=f"{b}/report.err") == 0
                and c.run([c.gpuckpt, "report", *f], timeout=c.cap(30)) == 0):
            c.s.keep(f"{b}/report.json", "transient.json")
        else:
            ok = False
            fail_tail("gpuckpt report", "report")
        h.rm_rf(f"{b}/torch.ckpt", f"{b}/migrate")
        if self.say("After the benchmarks, go on.") and self.state_equal():
            if ok:
                c.record("PASS", "torch transient", "restored twice, migrated once: the next "
                         f"tokens and the KV cache still equal the reference: {self.last_turn}")
        else:
            c.record("FAIL", "torch transient", self.last_turn)

    def rounds(self, torch_bytes):
        """Dumped and restored mid-conversation: plain, through --gpu-map, and --leave-running."""
        c = self.c
        failures_before_rounds = c.s.failures
        for rnd, mode in enumerate(("plain", "gpu-map", "leave-running"), start=1):
            tag = f"torch{rnd}"
            if not c.have_time(60, f"torch {mode}"):
                break
            if mode == "gpu-map" and c.remap != "true":
                c.record("SKIP", "torch gpu-map", REMAP_NEEDS)
                continue
            ckpt = c.path(f"{tag}.ckpt")
            c.restored.append(self.pid)
            if mode == "leave-running":
                if not c.criu_dump(tag, self.pid, ckpt, "--leave-running"):
                    break
            else:
                if not c.criu_dump(tag, self.pid, ckpt):
                    break
                if not c.wait_gone(self.pid):
                    c.record("FAIL", tag, f"pid {self.pid} still there after the dump")
                    break
                margs = ["--gpu-map", f"{c.gpu_uuid}={c.gpu_uuid}"] if mode == "gpu-map" else []
                if not c.criu_restore(tag, ckpt, self.sock, "PING", *margs):
                    break
                self.pid = c.new_pid
                dumped = h.plugin_figures(c.path(f"{tag}-dump.json"), torch_bytes or "0")
                restored = h.plugin_figures(c.path(f"{tag}-restore.json"), torch_bytes or "0")
                c.record("INFO", f"{tag} device", f"{dumped} | restore: {restored}")
            c.save_criu_logs(tag)
            h.rm_rf(ckpt)
            if self.say(f"Round {rnd}: go on where we stopped.") and self.state_equal():
                c.record("PASS", f"torch {mode}", "the next tokens and the KV cache equal the "
                         f"uninterrupted reference: {self.last_turn}")
            else:
                c.record("FAIL", f"torch {mode}", self.last_turn)
                break
        if c.s.failures == failures_before_rounds and c.have_time(90, "torch transient"):
            self.transient_figures()


def copy_figures(path):
    """criu_restore_tasks and memory_copy (seconds, GB/s) of a bench restore's first run."""
    try:
        with open(path) as f:
            stages = {st["name"]: st for st in json.load(f)["runs"][0]["stages"]}
    except Exception:
        return "no figures"
    out = []
    for name in ("criu_restore_tasks", "memory_copy", "memory_fill", "device_restore"):
        st = stages.get(name)
        if st:
            out.append(f"{name} {st['seconds']:.2f} s ({st.get('gbps', 0):.1f} GB/s)")
    return ", ".join(out) or "no figures"


def torch_importable(c):
    return c.run(["python3", "-c", "import torch"], out=DEVNULL, err=DEVNULL, env=c.py_env()) == 0


def run(c):
    if not c.o.do_torch:
        c.record("SKIP", "torch", "--no-torch")
    elif not torch_importable(c):
        c.record("SKIP", "torch", "python3 with torch is not installed here")
    elif not c.criu_ok:
        c.record("SKIP", "torch", "needs CRIU (above)")
    elif c.have_time(150, "torch"):
        t = Torch(c)
        t0 = h.now()
        c.launch_server("torch", "torch")
        c.launch_server("torch-ref", "torch")  # the uninterrupted reference run
        if not c.await_server("torch", "torch"):
            return
        t.pid, t.sock = c.srv_pid, c.srv_sock
        if not c.await_server("torch-ref", "torch"):
            return
        t.ref_sock = c.srv_sock
        info = c.ask_any("torch", t.sock, "INFO")
        torch_bytes = h.info_field(info, "reserved_bytes")
        c.record("PASS", "torch servers", f"{info}; reference pid {c.srv_pid} ({h.elapsed(t0)} s)")
        if t.say("Hello, who are you?") and t.say("Tell me about checkpoints."):
            c.record("PASS", "torch conversation",
                     f"2 turns, greedy tokens equal the reference: {t.last_turn}")
            t.rounds(torch_bytes)
        else:
            c.record("FAIL", "torch conversation", t.last_turn)
