"""The GPUs and the driver, as gpuckpt sees them (the check ends here, exit 7, without a GPU),
and what the results depend on beyond the driver."""

import os

import helpers as h
from context import DEVNULL


def run(c):
    js = c.path("devices.json")
    c.run([c.gpuckpt, "devices"], timeout=c.cap(60))
    rc = c.run([c.gpuckpt, "--json", "devices"], timeout=c.cap(60), out=js)
    c.s.keep(js, "devices.json")
    if rc == 7:
        c.record("FAIL", "devices", h.json_get(js, "reason"))
        raise SystemExit(7)
    if rc != 0:
        c.die(1, f"gpuckpt devices failed (exit {rc})")
    gpu_name = h.json_get(js, "gpus.0.name")
    c.gpu_uuid = h.json_get(js, "gpus.0.uuid")
    c.ckpt_api = h.json_get(js, "driver.checkpoint_api")
    c.remap = h.json_get(js, "driver.gpu_remap")
    driver = {k: h.json_get(js, f"driver.{k}")
              for k in ("cuda_version_string", "kernel_module_version", "library")}
    c.record("PASS", "devices", f"{gpu_name} {c.gpu_uuid}, {driver['cuda_version_string']}, "
             f"NVIDIA {driver['kernel_module_version']}, driver {driver['library']}, "
             f"checkpoint API: {c.ckpt_api}, GPU remap: {c.remap}")
    # What the results depend on beyond the driver: a VM's kernel decides what CRIU can do.
    ldd = h.first_line(c.output(["ldd", "--version"], err=DEVNULL))
    c.record("INFO", "environment", f"kernel {os.uname().release}, {ldd}, "
             f"{c.output(['nproc'])} CPUs, {mem_total()}, python3 {python_version(c)}")


def mem_total():
    for line in h.read_text("/proc/meminfo").split("\n"):
        if "MemTotal" in line:
            return f"{h.awk_num(h.awk_fields(line, 2)) / 1048576:.0f} GiB"
    return ""


def python_version(c):
    rc, out = c.output_raw(["python3", "-c", "import sys; print(sys.version.split()[0])"],
                           err=DEVNULL, env=c.py_env())
    return h.sub(out) if rc == 0 else h.sub(out + "none\n")
