"""The CUDA checkpoint without CRIU, one `gpuckpt cuda-checkpoint` process per step: lock,
checkpoint (the VRAM released), state, restore, unlock; the VRAM hash must be unchanged and the
next answer equal the twin's. With driver 580+, a suspend/resume through --gpu-map too."""

import helpers as h
from context import REMAP_NEEDS


def cuda_step(c, action, *args):
    """gpuckpt's exit code; its JSON in cuda-ACTION.json."""
    argv = [c.gpuckpt, "--json", "cuda-checkpoint", "--pid", c.demo_pid, "--action", action, *args]
    return c.run(argv, timeout=c.cap(90), out=c.path(f"cuda-{action}.json"),
                 err=c.path(f"cuda-{action}.err"))


def check_state(c, action, want):
    """Records the step; False on a wrong state."""
    js = c.path(f"cuda-{action}.json")
    got = h.json_get(js, "state_after")
    secs = h.stage_get(js, f"cuda_{action}", "seconds")
    init = h.stage_get(js, "cuda_init", "seconds")
    if got == want:
        c.record("PASS", f"cuda {action}", f"state {got} in {secs or '?'} s "
                 f"(this gpuckpt process's cuInit: {init or '?'} s, paid once)")
        return True
    err = h.cat(c.path(f"cuda-{action}.err"))
    c.record("FAIL", f"cuda {action}", f"state '{got}', expected '{want}': {err}")
    return False


def step_failed(c, action):
    c.record("FAIL", f"cuda {action}", h.cat(c.path(f"cuda-{action}.err")))


def vram_released(c, nvsmi_before):
    js = c.path("cuda-checkpoint.json")
    used_before = h.json_get(js, "gpu_memory_used_before")
    used_after = h.json_get(js, "gpu_memory_used_after")
    nvsmi_after = c.vram_of_pid(c.demo_pid)
    state_gb = h.div(c.vram_bytes, "1e9")
    # VRAM released: NVML's device-wide use drops by about the server's state, and nvidia-smi
    # no longer lists the process.
    if used_before and used_after:
        freed = int(h.awk_num(used_before)) - int(h.awk_num(used_after))
        if freed >= 0.9 * h.awk_num(c.vram_bytes):
            c.record("PASS", "vram released", f"NVML: {h.div(freed, '1e9')} GB freed (state "
                     f"{state_gb} GB); nvidia-smi: {nvsmi_before or '?'} MiB -> "
                     f"{nvsmi_after or 'not listed'}")
        else:
            c.record("FAIL", "vram released",
                     f"NVML: only {h.div(freed, '1e9')} GB freed of {state_gb} GB")
    elif nvsmi_before:
        if not nvsmi_after or nvsmi_after == "0":
            c.record("PASS", "vram released", f"nvidia-smi: {nvsmi_before} MiB -> not listed")
        else:
            c.record("FAIL", "vram released",
                     f"nvidia-smi still lists {nvsmi_after} MiB for pid {c.demo_pid}")
    else:
        c.record("SKIP", "vram released", "neither NVML nor nvidia-smi answered")


def run(c):
    c.restored.append(c.demo_pid)  # from here on it may be a restored CUDA process
    lock_s = ckpt_s = rest_s = unlock_s = ""
    nvsmi_before = c.vram_of_pid(c.demo_pid)
    stage_ok = False
    if cuda_step(c, "lock", "--timeout-ms", "10000") == 0:
        stage_ok = check_state(c, "lock", "locked")
        lock_s = h.stage_get(c.path("cuda-lock.json"), "cuda_lock", "seconds")
    else:
        step_failed(c, "lock")
    if stage_ok:
        stage_ok = False
        if cuda_step(c, "checkpoint") == 0:
            stage_ok = check_state(c, "checkpoint", "checkpointed")
        else:
            step_failed(c, "checkpoint")
    if stage_ok:
        ckpt_s = h.stage_get(c.path("cuda-checkpoint.json"), "cuda_checkpoint", "seconds")
        vram_released(c, nvsmi_before)
        cuda_step(c, "state")
        got = h.json_get(c.path("cuda-state.json"), "state_after")
        if got == "checkpointed":
            c.record("PASS", "cuda state", "a separate gpuckpt process sees 'checkpointed'")
        else:
            c.record("FAIL", "cuda state", f"'{got}': {h.cat(c.path('cuda-state.err'))}")
        stage_ok = False
        if cuda_step(c, "restore") == 0:
            stage_ok = check_state(c, "restore", "locked")
            rest_s = h.stage_get(c.path("cuda-restore.json"), "cuda_restore", "seconds")
        else:
            step_failed(c, "restore")
    if stage_ok:
        if cuda_step(c, "unlock") == 0:
            check_state(c, "unlock", "running")
            unlock_s = h.stage_get(c.path("cuda-unlock.json"), "cuda_unlock", "seconds")
        else:
            step_failed(c, "unlock")
    elif cuda_step(c, "resume") != 0:
        # Whatever failed, do not leave the server frozen on the GPU for the next checks.
        cuda_step(c, "unlock")
    # The stage figures, beside the ceilings measured above (pinned copies: the PCIe ceiling).
    vb = c.vram_bytes or "0"
    c.record("INFO", "stage figures",
             f"lock {lock_s or '?'} s | checkpoint {h.gbps(vb, ckpt_s or '0')} GB/s D2H in "
             f"{ckpt_s or '?'} s (PCIe pinned D2H ceiling {c.d2h or '?'} GB/s) | restore "
             f"{h.gbps(vb, rest_s or '0')} GB/s H2D in {rest_s or '?'} s (PCIe pinned H2D ceiling "
             f"{c.h2d or '?'} GB/s) | unlock {unlock_s or '?'} s | HBM {c.bw or '?'} GB/s | "
             f"bf16 tensor {c.tensor or '?'} GFLOP/s, mma.sync (not wgmma)")

    state = c.ask(c.demo_sock, "STATE")
    if h.hash_of(state) == c.hash_before:
        c.record("PASS", "vram hash (cuda)", f"identical after checkpoint+restore: {c.hash_before}")
    else:
        c.record("FAIL", "vram hash (cuda)", f"before {c.hash_before}, after '{state}'")

    # Restore through the gpuPairs path (identity map: a one-GPU machine has no other target).
    pair = f"{c.gpu_uuid}={c.gpu_uuid}"
    if c.remap != "true":
        c.record("SKIP", "cuda remap restore", REMAP_NEEDS)
    elif c.have_time(30, "cuda remap restore"):
        if (cuda_step(c, "suspend") == 0 and cuda_step(c, "resume", "--gpu-map", pair) == 0
                and h.hash_of(c.ask(c.demo_sock, "STATE")) == c.hash_before):
            c.record("PASS", "cuda remap restore",
                     f"suspend + resume --gpu-map {pair}, hash unchanged")
        else:
            c.record("FAIL", "cuda remap restore",
                     h.cat(c.path("cuda-suspend.err"), c.path("cuda-resume.err")))
            cuda_step(c, "resume")

    req = "GEN after the CUDA checkpoint"
    a, b = c.ask(c.demo_sock, req), c.ask(c.twin_sock, req)
    if a and a == b:
        c.record("PASS", "serving after restore",
                 f"same answer as the never-checkpointed twin: {a}")
    else:
        c.record("FAIL", "serving after restore", f"demo '{a}' vs twin '{b}'")
