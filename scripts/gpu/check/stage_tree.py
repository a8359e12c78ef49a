"""A tree with CUDA in several processes: the front and two workers.

Like a tensor-parallel server: the front never touches CUDA and each worker holds its share of
the VRAM state. The CRIU plugin must lock and checkpoint every worker, the restore must bring
back all of them with their VRAM, and a dump killed after the checkpoint must leave every
worker running with its VRAM back on the GPU.
"""

import os

import helpers as h

TREE_BYTES = 2147483648


class Tree:
    def __init__(self, c):
        self.c = c
        self.sock = self.twin_sock = self.hash = self.why = ""

    def pids(self, sock):
        """The front's pid and the workers'."""
        return h.tree_pids(self.c.ask(sock, "INFO"))

    def round(self, tag):
        """The STATE hash unchanged and the next answer equal to the twin's."""
        c = self.c
        state = c.ask(self.sock, "STATE")
        a, b = c.ask(self.sock, f"GEN {tag}"), c.ask(self.twin_sock, f"GEN {tag}")
        if self.hash and h.hash_of(state) == self.hash and a and a == b:
            self.hash = h.hash_of(c.ask(self.sock, "STATE"))
            return True
        self.why = f"STATE '{state}' (before {self.hash}), answer '{a}' vs twin '{b}'"
        return False

    def dump_and_restore(self, tpids):
        """False when the tree did not come back as it was (processes that outlived their dump
        are a FAIL of their own, and leave the killed dump to run)."""
        c = self.c
        ckpt = c.path("tree.ckpt")
        if not c.criu_dump("tree", tpids[0], ckpt):
            h.rm_rf(ckpt)
            return False
        ok = True
        c.restored.extend(tpids)
        gone = all([c.wait_gone(p) for p in tpids])
        if not gone:
            c.record("FAIL", "tree dump", "the tree's processes are still there after the dump")
        elif c.criu_restore("tree", ckpt, self.sock, "STATE"):
            npids = self.pids(self.sock)
            c.children.extend(npids)
            c.restored.extend(npids)
            dumped = h.plugin_figures(c.path("tree-dump.json"), TREE_BYTES)
            restored = h.plugin_figures(c.path("tree-restore.json"), TREE_BYTES)
            c.record("INFO", "tree device", f"{dumped} | restore: {restored}")
            # The plugin checkpoints and restores the workers together (issue 41): the wall
            # time should be about the longest worker's, not their sum.
            c.record("INFO", "tree together",
                     h.device_span(c.path("tree-dump.json"), "device_checkpoint") + "; " +
                     h.device_span(c.path("tree-restore.json"), "device_restore"))
            now, before = " ".join(npids), " ".join(tpids)
            if now == before and self.round("after a restore"):
                c.record("PASS", "tree restored", f"pids {now} as before, the workers' VRAM hash "
                         "unchanged, the next answer equals the twin's")
            else:
                c.record("FAIL", "tree restored", f"pids '{now}' (before '{before}'), {self.why}")
                ok = False
        else:
            ok = False
        c.save_criu_logs("tree")
        h.rm_rf(ckpt)
        return ok

    def killed_dump(self, tpids):
        """Killed after the plugin has checkpointed both workers (a staged dump at
        compress_write)."""
        c = self.c
        mark, ckpt, out = (c.path(f"tree-fault.{x}") for x in ("mark", "ckpt", "out"))
        h.rm_rf(mark, ckpt, c.path("tree-staging"))
        os.makedirs(c.path("tree-staging"), exist_ok=True)
        t0 = h.now()
        g = c.start_faulted_dump("compress_write", mark, tpids[0], ckpt, out,
                                 "--staging", c.path("tree-staging"))
        c.await_mark(mark, g)
        guard = (h.children_named(g, "gpuckpt-guard") + [""])[0]
        if not os.path.exists(mark) or not guard:
            c.kill9(g)
            c.wait(g)
            c.record("FAIL", "tree dump killed", "gpuckpt never reached compress_write, or has no "
                     f"guard: {h.oneline(c.tail(3, out))}")
            return
        c.kill9(g)
        c.wait(g)
        c.await_guard(guard)
        summary = h.guard_summary(h.read_text(out))
        words = all(f"the CUDA state of process {p} was restored" in summary for p in tpids[1:3])
        if words and not os.path.exists(ckpt) and self.round("after a killed dump"):
            c.record("PASS", "tree dump killed", "SIGKILL at compress_write: its guard gave both "
                     f"workers their VRAM back and resumed the tree, no checkpoint ('{summary}'); "
                     "the hash is unchanged and the next answer equals the twin's "
                     f"({h.elapsed(t0)} s)")
        else:
            left = "yes" if os.path.exists(ckpt) else "no"
            c.record("FAIL", "tree dump killed", f"summary '{summary}', {self.why}, "
                     f"checkpoint left: {left}; {h.oneline(c.tail(3, out))}")


def run(c):
    if not (c.criu_ok and c.have_time(70, "cuda tree")):
        return
    t = Tree(c)
    t0 = h.now()
    c.launch_server("tree", "demo", "2", "--workers", "2")
    c.launch_server("tree-twin", "demo", "2", "--workers", "2")
    if not c.await_server("tree", "demo"):
        return
    t.sock = c.srv_sock
    if not c.await_server("tree-twin", "demo"):
        return
    t.twin_sock = c.srv_sock
    tpids = t.pids(t.sock)
    twpids = t.pids(t.twin_sock)
    c.children.extend(tpids + twpids)
    a, b = c.ask(t.sock, "GEN a tree"), c.ask(t.twin_sock, "GEN a tree")
    t.hash = h.hash_of(c.ask(t.sock, "STATE"))
    if len(tpids) == 3 and t.hash and a and a == b:
        c.record("PASS", "tree server", f"front {tpids[0]}, CUDA workers {tpids[1]} {tpids[2]} "
                 f"(2 GiB of VRAM state between them), twin agrees: {a} ({h.elapsed(t0)} s)")
        tree_ok = t.dump_and_restore(tpids)
    else:
        c.record("FAIL", "tree server", f"pids '{' '.join(tpids)}', answer '{a}' vs twin '{b}'")
        tree_ok = False
        h.rm_rf(c.path("tree.ckpt"))
    if tree_ok and c.have_time(40, "tree dump killed"):
        t.killed_dump(tpids)
