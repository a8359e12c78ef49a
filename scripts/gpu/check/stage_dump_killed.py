"""gpuckpt killed in the middle of a dump: the service runs on, its VRAM given back.

The CRIU plugin locks and checkpoints the server's CUDA state while gpuckpt waits for criu;
gpuckpt learns which tasks once criu has finished. Killed before (criu_dump) or after
(compress_write, in a staged dump: --staging) that, the guard must resume the server with its
VRAM back on the GPU, and with the guard killed too, the next `gpuckpt recover` must. A
streaming dump (the default: no --staging) killed at criu_dump takes criu's image stream down
with gpuckpt while the plugin may be locking or checkpointing: whether the plugin had begun
depends on timing, so there only the server's answers are checked, not the summary's words.
The proof: the server answers STATE (a CUDA call: it blocks while the state is locked or in
host memory) with the hash of before, and its next answer equals the twin's.
"""

import os

import helpers as h


def run(c):
    if c.criu_ok and not c.alive(c.demo_pid):
        c.record("SKIP", "dump killed", f"the demo server (pid {c.demo_pid}) is not running")
        return
    if not c.criu_ok:
        return
    for fault in ("criu_dump", "compress_write", "criu_dump+guard", "criu_dump+stream"):
        name = f"dump killed at {fault}"
        if not c.have_time(40, name):
            break
        point = fault.rsplit("+", 1)[0]
        staging = [] if fault == "criu_dump+stream" else ["--staging", c.path("fault-staging")]
        hash_before = h.hash_of(c.ask(c.demo_sock, "STATE"))
        mark, ckpt, out = c.path("fault.mark"), c.path("fault.ckpt"), c.path("fault.out")
        h.rm_rf(mark, ckpt, c.path("fault-staging"))
        os.makedirs(c.path("fault-staging"), exist_ok=True)
        t0 = h.now()
        g = c.start_faulted_dump(point, mark, c.demo_pid, ckpt, out, *staging)
        c.await_mark(mark, g)
        if not os.path.exists(mark):
            c.kill9(g)
            c.wait(g)
            c.record("FAIL", name, f"gpuckpt never reached {point}: {h.oneline(c.tail(3, out))}")
            break
        guard = (h.children_named(g, "gpuckpt-guard") + [""])[0]
        if not guard:
            c.kill9(g)
            c.record("FAIL", name, f"no gpuckpt-guard child of gpuckpt {g}")
            break
        h.rm_rf(c.path("recover.json"))
        if fault != "criu_dump+guard":
            how = "its guard"
            c.kill9(g)
            c.wait(g)
            # Its summary goes to the stderr it shares with gpuckpt once it has recovered.
            c.await_guard(guard)
            summary = h.guard_summary(h.read_text(out))
        else:
            how = "gpuckpt recover"
            c.kill9(guard, g)
            c.wait(g)
            c.run([c.gpuckpt, "--json", "recover"], timeout=c.cap(90), out=c.path("recover.json"),
                  err=c.path("recover.err"))
            summary = h.json_get(c.path("recover.json"), "recovered.0.summary")
        state = c.ask(c.demo_sock, "STATE")
        req = "GEN after a killed dump"
        a, b = c.ask(c.demo_sock, req), c.ask(c.twin_sock, req)
        if (h.hash_of(state) == hash_before and a and a == b and not os.path.exists(ckpt)
                and (fault == "criu_dump+stream"
                     or f"the CUDA state of process {c.demo_pid} was restored" in summary)):
            c.record("PASS", name, f"SIGKILL at {point}: {how} resumed pid {c.demo_pid} with its "
                     f"VRAM (hash {hash_before}) and no checkpoint ('{summary}'); next answer "
                     f"equals the twin's ({h.elapsed(t0)} s)")
        else:
            left = "yes" if os.path.exists(ckpt) else "no"
            tail = h.oneline(c.tail(3, out, c.path("recover.err"), quiet=True))
            c.record("FAIL", name, f"after SIGKILL at {point} ({how}): summary '{summary}', "
                     f"STATE '{state}' (before {hash_before}), answer '{a}' vs twin '{b}', "
                     f"checkpoint left: {left}; {tail}")
            break
