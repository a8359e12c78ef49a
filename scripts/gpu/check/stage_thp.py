"""Is the driver's D2H bounded by the first touch of its host buffer? (issue 41)

On the H200 the checkpoint API moved VRAM to host at 1.5-2.0 GB/s, 3.6% of the pinned link and
close to that machine's first touch of fresh 4 KiB pages (1.9 GB/s; huge pages: 22 GB/s). The
demo server's VRAM state is checkpointed and restored by the driver alone (no CRIU) under each
transparent-huge-page mode, beside a first touch of fresh memory measured under the same mode:
if the D2H rate follows the first touch from mode to mode, the driver's host buffer is faulted in
page by page, and a THP setting (or a buffer prepared before the checkpoint) is what to apply.
The machine's THP mode is put back at the end, and by the runner's cleanup after a signal.
"""

import mmap
import re
import time

import helpers as h

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
MODES = ("madvise", "always", "never")
TOUCH_BYTES = 1 << 30


def thp_mode(text):
    """The selected mode of a THP control file ("always [madvise] never" -> "madvise"), or ""."""
    m = re.search(r"\[(\w+)\]", text or "")
    return m.group(1) if m else ""


def set_thp(mode):
    with open(THP_ENABLED, "w") as f:
        f.write(mode)


def put_back(c):
    """Puts the machine's THP mode back if a run changed it (the runner's cleanup calls it too)."""
    if not c.thp_restore:
        return
    try:
        set_thp(c.thp_restore)
        c.thp_restore = ""
    except OSError as e:
        c.record("FAIL", "thp d2h", f"could not put THP back to {c.thp_restore}: {e}")


def first_touch_gbps(nbytes=TOUCH_BYTES):
    """GB/s of one write per 4 KiB page into fresh anonymous memory, as a restore's fill."""
    with mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as m:
        if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            m.madvise(mmap.MADV_HUGEPAGE)  # what madvise mode needs; always and never ignore it
        ones = b"\x01" * (nbytes // 4096)
        view = memoryview(m)
        t0 = time.monotonic()
        view[::4096] = ones  # one strided copy in C: within the cost of a C loop's TLB misses
        seconds = time.monotonic() - t0
        view.release()
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def step(c, mode, action):
    """gpuckpt cuda-checkpoint ACTION on the demo server; its JSON path, or None if it failed."""
    js, err = c.path(f"thp-{mode}-{action}.json"), c.path(f"thp-{mode}-{action}.err")
    extra = ["--timeout-ms", "10000"] if action == "lock" else []
    argv = [c.gpuckpt, "--json", "cuda-checkpoint", "--pid", c.demo_pid, "--action", action,
            *extra]
    if c.run(argv, timeout=c.cap(90), out=js, err=err) == 0:
        return js
    c.record("FAIL", f"thp {mode}", f"cuda-checkpoint {action}: {h.cat(err)}")
    return None


def cuda_round(c, mode):
    """(D2H seconds, H2D seconds) of one checkpoint and restore under `mode`; None on a failure
    (recorded), after which the server is resumed, never left locked."""
    got = {}
    for action in ("lock", "checkpoint", "restore", "unlock"):
        js = step(c, mode, action)
        if not js:
            for undo in ("restore", "unlock"):  # whichever applies to where it stopped
                c.run([c.gpuckpt, "cuda-checkpoint", "--pid", c.demo_pid, "--action", undo],
                      timeout=c.cap(90), out=c.path(f"thp-{mode}-undo-{undo}.out"),
                      err=c.path(f"thp-{mode}-undo-{undo}.err"))
            return None
        got[action] = js
    return (h.stage_get(got["checkpoint"], "cuda_checkpoint", "seconds"),
            h.stage_get(got["restore"], "cuda_restore", "seconds"))


def summary_line(rows, vram_bytes, d2h_ceiling):
    """One INFO line: per mode, the first touch beside the driver's D2H and H2D."""
    parts = []
    for mode, touch, d2h_s, h2d_s in rows:
        parts.append(f"{mode}: first touch {touch:.2f} GB/s, D2H {h.gbps(vram_bytes, d2h_s or '0')}"
                     f" GB/s in {d2h_s or '?'} s, H2D {h.gbps(vram_bytes, h2d_s or '0')} GB/s in "
                     f"{h2d_s or '?'} s")
    return " | ".join(parts) + f" (pinned D2H ceiling {d2h_ceiling or '?'} GB/s)"


def run(c):
    if not c.demo_pid or not c.alive(c.demo_pid):
        c.record("SKIP", "thp d2h", "the CUDA demo server is not running")
        return
    original = thp_mode(h.read_text(THP_ENABLED))
    if not original:
        c.record("SKIP", "thp d2h", f"no transparent huge page control ({THP_ENABLED})")
        return
    if not c.have_time(20 * len(MODES), "thp d2h"):
        return
    c.thp_restore = original
    rows = []
    try:
        for mode in MODES:
            c.check_signal()
            try:
                set_thp(mode)
            except OSError as e:
                c.record("SKIP", f"thp {mode}", f"cannot set {THP_ENABLED}: {e}")
                continue
            touch = first_touch_gbps()
            r = cuda_round(c, mode)
            if r is None:
                break
            rows.append((mode, touch, *r))
    finally:
        put_back(c)
    if rows:
        c.record("INFO", "thp d2h", summary_line(rows, c.vram_bytes or "0", c.d2h))
    state = c.ask(c.demo_sock, "STATE")
    if h.hash_of(state) == c.hash_before:
        c.record("PASS", "vram hash (thp)", f"identical after {len(rows)} rounds: {c.hash_before}")
    else:
        c.record("FAIL", "vram hash (thp)", f"before {c.hash_before}, after '{state}'")
