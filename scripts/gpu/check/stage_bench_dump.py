"""With --bench-dump SIZE only: the storage path on this machine, `gpuckpt bench dump`
(gpuckpt streamed and staged, plain criu -D; each beside its floor) on a host with many cores,
where the dev VM's 2 vCPUs are the bound. On the repository's disk: the work dir may be a tmpfs.
Last: it takes what is left of the budget."""

import os

import helpers as h


def df_fields(c, path, *fields):
    """`df -hT PATH | tail -n 1 | awk '{ print $a, $b, ... }'` (a string is printed as it is)."""
    out = c.output(["df", "-hT", path])
    if not out:
        return ""
    line = out.split("\n")[-1]
    return " ".join(f if isinstance(f, str) else h.awk_fields(line, f) for f in fields)


def run(c):
    size = c.o.bench_size
    if size and not c.criu_ok:
        c.record("SKIP", "bench dump", "needs CRIU (above)")
        return
    if not (size and c.have_time(150, "bench dump")):
        return
    bdir = os.path.join(c.here, ".gpu-check-bench")
    h.rm_rf(bdir)
    os.makedirs(bdir, exist_ok=True)
    c.record("INFO", "bench disk", f"{df_fields(c, bdir, 2, 3, 'on', 7)}; "
             f"staging: {df_fields(c, '/dev/shm', 2, 3)}")
    js, err = c.path("bench-dump.json"), c.path("bench-dump.err")
    t0 = h.now()
    argv = [c.gpuckpt, "--json", "bench", "dump", "--dir", bdir, "--size", size, "--runs", "3",
            *c.criu_args]
    if c.run(argv, timeout=c.cap(900), out=js, err=err) == 0:
        c.s.keep(js, "bench-dump.json")
        table = h.bench_table(js)
        print(table, flush=True)
        c.record("INFO", "bench dump", h.first_line(table))
        c.record("PASS", "bench dump", f"{size}, 3 runs of each method ({h.elapsed(t0)} s); "
                 "the table is in the log and bench-dump.json")
    else:
        c.record("FAIL", "bench dump", f"{h.oneline(c.tail(5, err))} ({h.elapsed(t0)} s)")
    h.rm_rf(bdir)
