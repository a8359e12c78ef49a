"""The GPU check's results: the PASS/FAIL/SKIP/INFO records, summary.txt, the archive, the budget.

The device machine gives one command 10 minutes and may cut it off: summary.txt is rewritten
after every record, and results.tar.gz packed again after every addition, so that whatever was
done comes back.
"""

import os
import shutil
import sys
import tarfile
import time

ME = "gpu-check.sh"


class Summary:
    def __init__(self, work, out_dir, budget_s):
        self.results = []
        self.failures = 0
        self.budget_s = budget_s
        self.out_dir = out_dir
        self.summary_file = os.path.join(work, "summary.txt")
        self.results_dir = os.path.join(work, "results")
        os.makedirs(self.results_dir, exist_ok=True)
        self._start = time.monotonic()
        self.deadline = budget_s

    # ---- the budget (whole seconds since the start, as bash's $SECONDS) ----

    def seconds(self):
        return int(time.monotonic() - self._start)

    def left(self):
        return self.deadline - self.seconds()

    def cap(self, s):
        """s, or what is left of the budget (at least 1): every command's timeout."""
        return min(s, max(self.left(), 1))

    def have_time(self, s, name):
        """False, with a SKIP that says why, when the budget cannot fit a stage of ~s seconds."""
        if self.left() >= s:
            return True
        self.record("SKIP", name,
                    f"time budget: {self.left()} s left of {self.budget_s} s, needs ~{s} s")
        return False

    # ---- records and the summary ----

    @staticmethod
    def say(text):
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    def record(self, status, name, detail):
        self.results.append(f"{status:<5} {name:<26} {detail}")
        if status == "FAIL":
            self.failures += 1
        self.say(f"[{status}] {name}: {detail}")
        self.write()

    def text(self, final=False):
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        lines = [f"==== gpuckpt GPU check summary ({stamp}, {os.uname().nodename}) ===="]
        lines += self.results
        if not final:
            lines.append("RESULT: incomplete (still running, or stopped at "
                         f"{self.seconds()} s of {self.budget_s} s)")
        elif self.failures == 0:
            lines.append("RESULT: all checks passed")
        else:
            lines.append(f"RESULT: {self.failures} check(s) FAILED")
        return "\n".join(lines) + "\n"

    def write(self, final=False):
        tmp = self.summary_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(self.text(final))
        os.replace(tmp, self.summary_file)
        if self.out_dir:
            shutil.copyfile(self.summary_file, os.path.join(self.out_dir, "summary.txt"))

    def print_final(self):
        self.write(final=True)
        print()
        with open(self.summary_file) as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()

    # ---- the archive: everything else that comes back, in $OUT/results.tar.gz ----
    # The device tool returns at most 8 files: $OUT holds gpu-check.log, summary.txt and this.

    def pack(self):
        if not self.out_dir:
            return
        dest = os.path.join(self.out_dir, "results.tar.gz")
        with tarfile.open(dest + ".tmp", "w:gz") as tar:
            tar.add(self.results_dir, arcname=".")
        os.replace(dest + ".tmp", dest)

    def keep(self, path, name):
        """A copy of the file at path, as name in the archive."""
        try:
            shutil.copyfile(path, os.path.join(self.results_dir, name))
        except OSError as e:
            print(f"cp: {e}", file=sys.stderr)
            return
        self.pack()

    def append(self, name, data):
        """data (bytes or text) appended to name in the archive."""
        if isinstance(data, str):
            data = data.encode()
        with open(os.path.join(self.results_dir, name), "ab") as f:
            f.write(data)
        self.pack()
