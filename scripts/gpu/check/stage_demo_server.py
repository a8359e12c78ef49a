"""The CUDA demo server with --vram-gib of VRAM state, and its twin (same seed, same
requests, never checkpointed): the reference every later answer is compared with."""

import os

import helpers as h


def run(c):
    if not os.access(c.server, os.X_OK):
        c.die(1, f"{c.server} missing: nvcc was not found when building")
    if c.ckpt_api != "true":
        why = h.json_get(c.path("devices.json"), "driver.checkpoint_error")
        c.die(1, f"the driver lacks the checkpoint API: {why}")
    t0 = h.now()
    c.launch_server("demo", "demo")
    c.launch_server("twin", "demo")  # same seed and requests, never checkpointed: the reference
    if not c.await_server("demo", "demo"):
        raise SystemExit(1)
    c.demo_pid, c.demo_sock = c.srv_pid, c.srv_sock
    if not c.await_server("twin", "demo"):
        raise SystemExit(1)
    c.twin_pid, c.twin_sock = c.srv_pid, c.srv_sock
    c.vram_bytes = h.info_field(c.ask(c.demo_sock, "INFO"), "vram_bytes")
    gib = h.div(c.vram_bytes or "0", 1073741824)
    c.record("PASS", "demo server", f"pid {c.demo_pid} with {gib} GiB of VRAM state, "
             f"twin pid {c.twin_pid} ({h.elapsed(t0)} s)")

    requests_ok = True
    a = b = ""
    for req in ("GEN The capital of France is", "GEN Checkpoint me",
                "GEN and restore me, byte for byte"):
        a, b = c.ask(c.demo_sock, req), c.ask(c.twin_sock, req)
        if not a or a != b:
            requests_ok = False
    state = c.ask(c.demo_sock, "STATE")
    c.hash_before = h.hash_of(state)
    if requests_ok and c.hash_before:
        c.record("PASS", "requests", f"3 GEN requests, deterministic (twin agrees): {state}")
    else:
        c.record("FAIL", "requests",
                 f"demo and twin disagree or did not answer (demo: '{a}', twin: '{b}')")
