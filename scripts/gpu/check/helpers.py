"""Reading what gpuckpt and the servers print: JSON fields, timelines, replies, figures.

No GPU and no commands here, so that the self-tests check these on the shapes that gpuckpt's
--json output and the servers' replies really have. Text comes back the way the shell
version's $(...) gave it: trailing newlines dropped, and an empty string where it got nothing.
"""

import glob
import json
import os
import re
import shutil
import time
import traceback


def sub(text):
    """What $(...) makes of a command's output: its trailing newlines dropped."""
    return text.rstrip("\n")


def oneline(text):
    """`| tr '\\n' ' '`: newlines become spaces, the last one too."""
    return text.replace("\n", " ")


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def cat(*paths):
    """`$(cat FILE... 2>/dev/null)`."""
    return sub("".join(read_text(p) for p in paths))


def rm_rf(*paths):
    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def first_line(text):
    """`| head -n 1` inside $(...)."""
    return text.split("\n", 1)[0]


def now():
    return time.time()


def elapsed(t0):
    return f"{time.time() - t0:.3f}"


_NUM = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def awk_num(v):
    """A value as awk reads a -v assignment: its leading number, else 0."""
    if isinstance(v, (int, float)):
        return float(v)
    m = _NUM.match(v or "")
    return float(m.group(0)) if m else 0.0


def div(a, b):
    a, b = awk_num(a), awk_num(b)
    return f"{a / b:.2f}" if b > 0 else "n/a"


def gbps(nbytes, seconds):
    b, s = awk_num(nbytes), awk_num(seconds)
    return f"{b / s / 1e9:.2f}" if s > 0 and b > 0 else "n/a"


def _load(path):
    with open(path) as f:
        return json.load(f)


def json_get(path, key):
    """The scalar at KEY (nested: a.b.c, list indices as numbers) of a JSON file; "" when absent.
    Booleans as true/false, as the shell compares them."""
    try:
        v = _load(path)
        for k in key.split("."):
            v = v[int(k)] if isinstance(v, list) else v.get(k)
            if v is None:
                break
    except Exception:
        return ""
    if v is None:
        return ""
    return sub(str(v).lower() if isinstance(v, bool) else str(v))


def stage_get(path, stage, field):
    """FIELD of the first stage named STAGE in a gpuckpt --json "timeline"; "" when absent."""
    try:
        for s in _load(path)["timeline"]["stages"]:
            if s["name"] == stage:
                return sub(str(s[field]))
    except Exception:
        pass
    return ""


def timeline_text(path):
    """A gpuckpt --json timeline as a table; the file as it is when it is not one."""
    out = []
    try:
        t = _load(path)["timeline"]
        for s in t["stages"]:
            gb = s["bytes"] / 1e9
            out.append(f"    {s['name']:<24} {s['seconds']:9.3f} s  {gb:9.3f} GB  "
                       f"{s['gbps']:8.2f} GB/s\n")
        out.append(f"    {'total':<24} {t['total_seconds']:9.3f} s\n")
    except Exception:
        out.append(read_text(path))
    return "".join(out)


def print_timeline(path):
    print(timeline_text(path), end="", flush=True)


_DEVICE_STAGE = re.compile(
    r"^(cuda_init|device_lock|device_checkpoint|device_restore|unlock)(@[0-9]+)?$")


def plugin_figures(path, nbytes):
    """The device stages of a gpuckpt dump/restore JSON, with GB/s for the copies. A tree's are
    NAME@PID, one per process with CUDA state: their bytes are not known apart, so no rate."""
    names = re.findall(r'"name": *"([^"]*)"', read_text(path))
    out = ""
    for n in names:
        if not _DEVICE_STAGE.match(n):
            continue
        s = stage_get(path, n, "seconds")
        if not s:
            continue
        if n in ("device_checkpoint", "device_restore"):
            out += f"{n} {s} s ({gbps(nbytes, s)} GB/s) "
        else:
            out += f"{n} {s} s "
    return out or "no device stages"


def device_span(path, name):
    """How a tree's per-process device stages NAME@PID of a gpuckpt --json timeline ran: their
    count, their seconds added up, and the wall time from the first start to the last end.
    Together, the wall time is about the longest one; one after the other, about the sum."""
    try:
        spans = [(float(s["start"]), float(s["seconds"]))
                 for s in _load(path)["timeline"]["stages"]
                 if s["name"].startswith(name + "@")]
    except Exception:
        spans = []
    if not spans:
        return f"no {name}@PID stages"
    total = sum(d for _, d in spans)
    wall = max(a + d for a, d in spans) - min(a for a, _ in spans)
    return f"{name}: {len(spans)} processes, {total:.3f} s added up, {wall:.3f} s wall"


def hash_of(reply):
    """The hash in a demo server's `OK <n> <hash>` reply (its third word)."""
    return sub("\n".join((line.split() + ["", "", ""])[2] for line in reply.split("\n")))


def info_values(reply, *keys):
    """The values of KEY=VALUE words of a server's INFO reply, in order, for any of keys."""
    out = []
    for word in reply.replace(" ", "\n").split("\n"):
        for k in keys:
            if word.startswith(k + "="):
                out.append(word[len(k) + 1:])
    return out


def info_field(reply, key):
    return "\n".join(info_values(reply, key))


def tree_pids(reply):
    """The front's pid and the workers' from a tree server's INFO (pid=, worker_pids=a,b)."""
    out = []
    for v in info_values(reply, "pid", "worker_pids"):
        out += v.split(",")
    return out


def guard_summary(text):
    """What a guard says it did, from the stderr it shares with the gpuckpt it outlived."""
    prefix = "gpuckpt-guard: gpuckpt ended in the middle of an operation; "
    lines = text.split("\n")
    return sub("\n".join(line[len(prefix):] for line in lines if line.startswith(prefix)))


def children_named(parent, comm):
    """Pids of the processes named comm whose parent is parent."""
    out = []
    for d in sorted(glob.glob("/proc/[0-9]*")):
        if sub(read_text(d + "/comm")) != comm:
            continue
        stat = read_text(d + "/stat").split()
        if len(stat) > 3 and stat[3] == str(parent):
            out.append(d[len("/proc/"):])
    return out


def awk_fields(line, *idx):
    """`awk '{ print $a, $b }'` of one line (1-based; a missing field is empty)."""
    f = line.split()
    return " ".join(f[i - 1] if 0 < i <= len(f) else "" for i in idx)


def bench_table(path):
    """gpuckpt bench dump's JSON as text: the ceilings and floors, then one line per method.
    On a shape it does not know, what it made so far and the traceback (the log shows why)."""
    out = []
    try:
        j = _load(path)
        p, f = j["path"], j["floors"]
        out.append(
            f"cores {p['cores']}, write {p['disk_write_gbps']:.2f} GB/s, "
            f"read {p['disk_read_gbps']:.2f} GB/s, fill {p['fill_gbps']:.2f} / "
            f"huge {p['fill_huge_gbps']:.2f} GB/s, zstd {p['zstd_compress_gbps']:.2f} / "
            f"{p['zstd_decompress_gbps']:.2f} GB/s per core; "
            f"floors: dump {f['dump']['seconds']:.2f} s ({f['dump']['bound']}), "
            f"restore {f['restore']['seconds']:.2f} s ({f['restore']['bound']})")
        for m in j["methods"]:
            def r(k, m=m):
                return m.get(k) if m.get(k) is not None else float("nan")
            out.append(
                f"  {m['name']:<12} dump {r('dump_median_seconds'):6.2f} s "
                f"({r('dump_time_vs_criu'):.2f}x criu, {r('dump_percent_of_floor'):.0f}% of floor; "
                f"exited {r('dump_exit_median_seconds'):.2f} s) runs {m.get('dump_seconds')}, "
                f"restore {r('restore_median_seconds'):6.2f} s "
                f"({r('restore_time_vs_criu'):.2f}x criu, "
                f"{r('restore_percent_of_floor'):.0f}% of floor) runs {m.get('restore_seconds')}, "
                f"extra {r('dump_extra_median_bytes') / 2**20:.0f} / "
                f"{r('restore_extra_median_bytes') / 2**20:.0f} MiB")
    except Exception:
        out.append(traceback.format_exc())
    return sub("\n".join(out))
