"""A full `gpuckpt dump` + `gpuckpt restore` of the demo server through CRIU: the VRAM
hash and the next answer compared again."""

import helpers as h


def run(c):
    if not (c.criu_ok and c.have_time(90, "demo criu")):
        return
    c.hash_before = h.hash_of(c.ask(c.demo_sock, "STATE"))
    ckpt = c.path("demo.ckpt")
    vram = c.vram_bytes or "0"
    if c.criu_dump("demo", c.demo_pid, ckpt):
        c.record("INFO", "demo dump device", h.plugin_figures(c.path("demo-dump.json"), vram))
        c.wait_gone(c.demo_pid)
        if c.criu_restore("demo", ckpt, c.demo_sock, "STATE"):
            c.demo_pid = c.new_pid
            c.record("INFO", "demo restore device",
                     h.plugin_figures(c.path("demo-restore.json"), vram))
            state = c.ask(c.demo_sock, "STATE")
            if h.hash_of(state) == c.hash_before:
                c.record("PASS", "vram hash (criu)",
                         f"identical after dump+restore: {c.hash_before}")
            else:
                c.record("FAIL", "vram hash (criu)", f"before {c.hash_before}, after '{state}'")
            a, b = c.ask(c.demo_sock, "GEN after CRIU"), c.ask(c.twin_sock, "GEN after CRIU")
            if a and a == b:
                c.record("PASS", "serving after criu", f"same answer as the twin: {a}")
            else:
                c.record("FAIL", "serving after criu", f"restored '{a}' vs twin '{b}'")
    c.save_criu_logs("demo")
    h.rm_rf(ckpt)
