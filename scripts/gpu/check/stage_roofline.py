"""The GPU's ceilings (HBM, FP32, the bf16 tensor figure, pinned host<->device copies), the
figures the checkpoint's moves are set beside; then gpuckpt's own view of them."""

import os

import helpers as h


def run(c):
    if not os.access(c.roofline, os.X_OK):
        c.record("FAIL", "roofline", f"{c.roofline} missing: nvcc was not found when building")
        return
    if not c.have_time(60, "roofline"):
        return
    js, err = c.path("roofline.json"), c.path("roofline.err")
    t0 = h.now()
    if c.run([c.roofline], timeout=c.cap(90), out=js, err=err) == 0:
        c.s.keep(js, "roofline.json")
        c.bw = h.json_get(js, "bandwidth_gbps")
        c.d2h = h.json_get(js, "details.d2h_pinned_gbps")
        c.h2d = h.json_get(js, "details.h2d_pinned_gbps")
        c.tensor = h.json_get(js, "tensor_gflops")
        c.fp32 = h.json_get(js, "fp32_gflops")
        copy, triad = h.json_get(js, "details.copy_gbps"), h.json_get(js, "details.triad_gbps")
        c.record("PASS", "roofline", f"HBM {c.bw} GB/s (copy {copy}, triad {triad}), FP32 {c.fp32} "
                 f"GFLOP/s, bf16 tensor {c.tensor} GFLOP/s by mma.sync (not wgmma: a lower bound "
                 f"on Hopper), pinned H2D {c.h2d} / D2H {c.d2h} GB/s ({h.elapsed(t0)} s)")
    else:
        c.record("FAIL", "roofline", f"gpuckpt-roofline-gpu failed: {h.sub(c.tail(3, err))}")
    # The CLI's view of the same measurement (runs the binary next to gpuckpt).
    cli, cli_err = c.path("cli-roofline.json"), c.path("cli-roofline.err")
    if c.run([c.gpuckpt, "--json", "roofline", "--target", "gpu", "--quick"], timeout=c.cap(60),
             out=cli, err=cli_err) == 0:
        c.record("PASS", "gpuckpt roofline", "parsed the kernels' JSON")
    else:
        c.record("FAIL", "gpuckpt roofline", h.sub(c.tail(2, cli_err)))
