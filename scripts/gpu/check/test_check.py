"""The GPU check's self-tests, without a GPU: the command line, the summary and its archive, the
parsing of gpuckpt's --json output and the servers' replies (shapes from real runs,
docs/gpu-runs/), the SKIPs with their reasons, lock-then-kill, and the runner's exits (7 without
a GPU, 2 on usage, 130 on a signal) through a fake gpuckpt.

  python3 -m unittest discover -s scripts/gpu/check -p 'test_*.py'     (from the repository root)
"""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import unittest
from unittest import mock

import helpers as h
import runner
import stage_bench_dump
import stage_criu
import stage_demo_criu
import stage_dump_killed
import stage_roofline
import stage_tests
import stage_thp
import stage_torch
import stage_tree
from context import Context
from summary import Summary

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
RUNNER = os.path.join(HERE, "runner.py")

# `gpuckpt --json devices` on the H200 of docs/gpu-runs/, and without a GPU.
DEVICES_GPU = {
    "ok": True,
    "driver": {"loaded": True, "error": "", "library": "/usr/local/nvidia/lib64/libcuda.so.1",
               "cuda_version": 13000, "cuda_version_string": "CUDA 13.0",
               "kernel_module_version": "580.159.04", "checkpoint_api": True, "gpu_remap": True,
               "checkpoint_error": ""},
    "gpus": [{"index": 0, "name": "NVIDIA H200",
              "uuid": "GPU-14592d8c-aa55-e810-7064-9b7446d35881"}],
}
NO_GPU_REASON = ("no NVIDIA GPU: NVIDIA driver not installed (libcuda.so.1: cannot open shared "
                 "object file)")
DEVICES_NO_GPU = {"ok": False, "gpus": [], "reason": NO_GPU_REASON,
                  "driver": {"loaded": False, "checkpoint_api": False, "gpu_remap": False}}


def stage(name, seconds, nbytes=0, start=0.0):
    return {"name": name, "seconds": seconds, "start": start, "bytes": nbytes,
            "gbps": nbytes / seconds / 1e9 if seconds else 0.0}


def timeline(total, *stages):
    return {"total_seconds": total, "stages": list(stages)}


# `gpuckpt --json cuda-checkpoint --action lock` (timeline_json: total_seconds, stages).
CUDA_LOCK = {"ok": True, "pid": 703, "action": "lock", "state_before": "running",
             "state_after": "locked", "restore_tid": 0, "gpu_memory_used_before": 5466000000,
             "gpu_memory_used_after": 5466000000,
             "timeline": timeline(0.0129, stage("cuda_init", 0.012315809),
                                  stage("cuda_lock", 0.00057585, start=0.0123))}
# A streaming `gpuckpt --json dump` of the demo server, and of a tree's front (NAME@PID stages).
DEMO_DUMP = {"ok": True, "image_bytes": 4876613679, "gpu": True,
             "timeline": timeline(3.216, stage("preflight", 0.112),
                                  stage("criu_dump", 3.083, 3561192542),
                                  stage("cuda_init", 0.011006138), stage("device_lock", 0.01171677),
                                  stage("device_checkpoint", 2.502195995),
                                  stage("compress_write", 1.457, 3561192542))}
TREE_DUMP = {"ok": True, "image_bytes": 3306433094, "gpu": True,
             "timeline": timeline(3.4, stage("criu_dump", 3.1, 3306433094),
                                  stage("cuda_init@3511", 0.011950926),
                                  stage("device_lock@3518", 0.000695283),
                                  stage("device_lock@3519", 0.000522102),
                                  stage("device_checkpoint@3518", 1.127421604),
                                  stage("device_checkpoint@3519", 0.900155392))}
# `gpuckpt --json bench dump` (the 2026-12-04 H200 run, one method of four).
BENCH_DUMP = {
    "path": {"cores": 16, "disk_read_gbps": 0.8583949000928073,
             "disk_write_gbps": 1.1360954004056418, "fill_gbps": 1.9184662964508628,
             "fill_huge_gbps": 22.544853082656036, "zstd_compress_gbps": 0.7429783318121448,
             "zstd_decompress_gbps": 2.7394160556827267},
    "floors": {"dump": {"bound": "disk write", "seconds": 2.944772420349099},
               "restore": {"bound": "disk read", "seconds": 3.897439746715981}},
    "methods": [{"name": "stream", "dump_extra_median_bytes": 413310976,
                 "dump_median_seconds": 2.367519398, "dump_percent_of_floor": 124.38218765331945,
                 "dump_seconds": [2.573841856, 2.367519398],
                 "dump_time_vs_criu": 0.6489090571661463,
                 "dump_exit_median_seconds": 2.5, "restore_extra_median_bytes": 251035648,
                 "restore_median_seconds": 2.884623096,
                 "restore_percent_of_floor": 135.1108833635984,
                 "restore_seconds": [3.073545928, 2.884623096],
                 "restore_time_vs_criu": 1.0237200477153918}]}


def rec(status, name, detail):
    """A summary line (its format is checked once, in SummaryWriter)."""
    return f"{status:<5} {name:<26} {detail}"


def write(path, content, mode=0o644):
    with open(path, "w") as f:
        f.write(content if isinstance(content, str)
                else json.dumps(content, indent=2, sort_keys=True))
    os.chmod(path, mode)
    return path


def fake_bundle(root, script):
    """A bundle whose gpuckpt is a shell script."""
    os.makedirs(os.path.join(root, "bin"))
    write(os.path.join(root, "bin", "gpuckpt"), "#!/bin/sh\n" + textwrap.dedent(script), 0o755)
    return root


NO_GPU_GPUCKPT = f"""\
    if [ "$1" = --json ]; then cat <<'EOF'
    {json.dumps(DEVICES_NO_GPU)}
    EOF
    else echo "{NO_GPU_REASON}" >&2; fi
    exit 7
"""


class TempDir(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="gpu-check-test.")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def context(self, *args, budget="330", out_dir=""):
        opts = runner.parse_args([*args, "--budget-s", budget], REPO, env={})
        work = os.path.join(self.tmp, "work")
        os.makedirs(work, exist_ok=True)
        return Context(opts, REPO, work, out_dir)


class CommandLine(unittest.TestCase):
    def parse(self, *args, env=None):
        return runner.parse_args(list(args), "/repo", env={} if env is None else env)

    def usage_error(self, *args):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as e:
            self.parse(*args)
        return e.exception.code, err.getvalue()

    def test_defaults(self):
        o = self.parse()
        self.assertEqual((o.build, o.bundle, o.make_bundle, o.vram_gib, o.torch_gib, o.budget_s,
                          o.jobs, o.bench_size),
                         ("/repo/build-gpu-check", "", "", "4", "1.5", 330, "16", ""))
        self.assertEqual((o.do_criu, o.do_torch, o.do_tests, o.keep), (True, True, True, False))

    def test_build_dir_from_the_environment_unless_empty(self):
        self.assertEqual(self.parse(env={"GPUCKPT_BUILD_DIR": "/b"}).build, "/b")
        self.assertEqual(self.parse(env={"GPUCKPT_BUILD_DIR": ""}).build, "/repo/build-gpu-check")
        o = self.parse("--build-dir", "rel", env={"GPUCKPT_BUILD_DIR": "/b"})
        self.assertEqual(o.build, "rel")

    def test_every_option(self):
        o = self.parse("--bundle", "gpu-bundle", "--make-bundle", "mb", "--vram-gib", "2.5",
                       "--torch-gib", "8", "--budget-s", "290", "--no-criu", "--no-torch",
                       "--no-tests", "--keep", "--jobs", "2", "--bench-dump", "4G")
        self.assertEqual((o.bundle, o.make_bundle, o.vram_gib, o.torch_gib, o.budget_s, o.jobs,
                          o.bench_size), ("gpu-bundle", "mb", "2.5", "8", 290, "2", "4G"))
        self.assertEqual((o.do_criu, o.do_torch, o.do_tests, o.keep), (False, False, False, True))

    def test_help_prints_the_usage_and_exits_0(self):
        code, err = self.usage_error("--no-torch", "-h", "--bogus")
        self.assertEqual(code, 0)
        self.assertEqual(err, runner.USAGE)
        self.assertEqual(self.usage_error("--help")[0], 0)

    def test_usage_errors_exit_2(self):
        for args, message in [
                (["--bogus"], "gpu-check.sh: unknown argument --bogus\n"),
                (["--build-dir=x"], "gpu-check.sh: unknown argument --build-dir=x\n"),
                (["--vram-gib", "4x"], "gpu-check.sh: --vram-gib needs a number\n"),
                (["--torch-gib", "-1"], "gpu-check.sh: --torch-gib needs a number\n"),
                (["--budget-s", "1.5"], "gpu-check.sh: --budget-s needs whole seconds\n"),
                (["--jobs"], "gpu-check.sh: --jobs needs a value\n"),
                (["--bundle", ""], "gpu-check.sh: --bundle needs a value\n")]:
            code, err = self.usage_error(*args)
            self.assertEqual(code, 2, args)
            self.assertTrue(err.startswith(message), (args, err))
        self.assertIn("Options: --build-dir DIR", self.usage_error("--bogus")[1])

    def test_the_wrapper_keeps_the_command_line(self):
        sh = os.path.join(REPO, "scripts", "gpu-check.sh")
        r = subprocess.run(["bash", sh, "--help"], capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stderr), (0, runner.USAGE))
        r = subprocess.run(["bash", sh, "--vram-gib", "x"], capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stderr), (2, "gpu-check.sh: --vram-gib needs a number\n"))


class SummaryWriter(TempDir):
    def summary(self, budget=330, out=True):
        out_dir = os.path.join(self.tmp, "out") if out else ""
        if out_dir:
            os.makedirs(out_dir)
        return Summary(self.tmp, out_dir, budget), out_dir

    def read(self, path):
        with open(path) as f:
            return f.read().split("\n")

    def test_records_are_rewritten_after_every_check(self):
        s, out = self.summary()
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            s.record("PASS", "devices", "NVIDIA H200 GPU-1")
            lines = self.read(os.path.join(out, "summary.txt"))
            self.assertEqual(lines[1], "PASS  devices                    NVIDIA H200 GPU-1")
            self.assertEqual(lines[2], "RESULT: incomplete (still running, or stopped at 0 s of "
                                       "330 s)")
            s.record("FAIL", "dump killed at compress_write", "why")
            s.record("SKIP", "torch", "--no-torch")
            s.record("INFO", "environment", "kernel x")
        self.assertRegex(printed.getvalue(),
                         r"^\d\d:\d\d:\d\d \[PASS\] devices: NVIDIA H200 GPU-1\n")
        self.assertEqual(s.failures, 1)
        lines = self.read(s.summary_file)
        self.assertRegex(lines[0], r"^==== gpuckpt GPU check summary "
                                   r"\(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ, .+\) ====$")
        # A name longer than its column pushes its detail along, as printf did.
        self.assertEqual(lines[2], "FAIL  dump killed at compress_write why")
        self.assertEqual(lines[3], "SKIP  torch                      --no-torch")
        self.assertEqual(lines[4], "INFO  environment                kernel x")
        self.assertEqual(self.read(os.path.join(out, "summary.txt")), lines)
        with contextlib.redirect_stdout(io.StringIO()) as final:
            s.print_final()
        self.assertEqual(self.read(s.summary_file)[-2:], ["RESULT: 1 check(s) FAILED", ""])
        self.assertTrue(final.getvalue().startswith("\n==== gpuckpt GPU check summary"))

    def test_all_passed(self):
        s, _ = self.summary(out=False)
        with contextlib.redirect_stdout(io.StringIO()):
            s.record("PASS", "build", "x")
            s.print_final()
        self.assertEqual(self.read(s.summary_file)[-2], "RESULT: all checks passed")

    def test_the_archive_is_packed_again_at_each_addition(self):
        s, out = self.summary()
        s.keep(write(os.path.join(self.tmp, "devices.json"), DEVICES_GPU), "devices.json")
        s.append("criu.log", "==== demo\n")
        s.append("criu.log", b"==== tree\n")
        with tarfile.open(os.path.join(out, "results.tar.gz")) as t:
            self.assertEqual(sorted(t.getnames()), [".", "./criu.log", "./devices.json"])
            self.assertEqual(t.extractfile("./criu.log").read(), b"==== demo\n==== tree\n")
            self.assertEqual(json.load(t.extractfile("./devices.json")), DEVICES_GPU)
        self.assertEqual(sorted(os.listdir(out)), ["results.tar.gz"])

    def test_without_out_nothing_is_packed(self):
        s, _ = self.summary(out=False)
        s.append("tests.log", "x")
        self.assertEqual(os.listdir(s.results_dir), ["tests.log"])

    def test_budget_cap_and_skips_that_name_their_reason(self):
        s, _ = self.summary(budget=45)
        self.assertEqual((s.cap(30), s.cap(90)), (30, 45))
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertTrue(s.have_time(40, "dump killed at criu_dump"))
            self.assertFalse(s.have_time(60, "roofline"))
            s.deadline = -5
            self.assertEqual(s.cap(90), 1)  # past the budget, a command still gets a second
            self.assertFalse(s.have_time(20, "device_gpu_test"))
        self.assertEqual(s.results, [
            rec("SKIP", "roofline", "time budget: 45 s left of 45 s, needs ~60 s"),
            rec("SKIP", "device_gpu_test", "time budget: -5 s left of 45 s, needs ~20 s")])
        self.assertEqual(s.failures, 0)


class ParsingOutput(TempDir):
    def file(self, name, content):
        return write(os.path.join(self.tmp, name), content)

    def test_json_get(self):
        gpu = self.file("d.json", DEVICES_GPU)
        self.assertEqual(h.json_get(gpu, "gpus.0.name"), "NVIDIA H200")
        self.assertEqual(h.json_get(gpu, "driver.checkpoint_api"), "true")  # as the shell has it
        self.assertEqual(h.json_get(gpu, "driver.cuda_version"), "13000")
        self.assertEqual(h.json_get(gpu, "driver.checkpoint_error"), "")
        for missing in ("reason", "gpus.1.name", "gpus.x", "driver.library.x", "no.such.key"):
            self.assertEqual(h.json_get(gpu, missing), "", missing)
        nogpu = self.file("n.json", DEVICES_NO_GPU)
        self.assertEqual(h.json_get(nogpu, "reason"), NO_GPU_REASON)
        self.assertEqual(h.json_get(nogpu, "gpus.0.name"), "")
        self.assertEqual(h.json_get(self.file("bad.json", "{not json"), "ok"), "")
        self.assertEqual(h.json_get(os.path.join(self.tmp, "absent.json"), "ok"), "")
        recover = self.file("r.json", {"recovered": [{"summary": "process 703 was resumed"}]})
        self.assertEqual(h.json_get(recover, "recovered.0.summary"), "process 703 was resumed")

    def test_stage_get(self):
        lock = self.file("lock.json", CUDA_LOCK)
        self.assertEqual(h.stage_get(lock, "cuda_lock", "seconds"), "0.00057585")
        self.assertEqual(h.stage_get(lock, "cuda_init", "seconds"), "0.012315809")
        self.assertEqual(h.stage_get(lock, "cuda_checkpoint", "seconds"), "")
        self.assertEqual(h.stage_get(lock, "cuda_lock", "nothing"), "")
        self.assertEqual(h.stage_get(self.file("d.json", DEVICES_GPU), "x", "seconds"), "")

    def test_print_timeline(self):
        dump = self.file("dump.json", DEMO_DUMP)
        lines = h.timeline_text(dump).split("\n")
        self.assertEqual(lines[0], "    preflight                    0.112 s      0.000 GB      "
                                   "0.00 GB/s")
        self.assertEqual(lines[1], "    criu_dump                    3.083 s      3.561 GB      "
                                   "1.16 GB/s")
        self.assertEqual(lines[-2:], ["    total                        3.216 s", ""])
        other = self.file("other.json", '{"ok": false}\n')
        self.assertEqual(h.timeline_text(other), '{"ok": false}\n')  # not a timeline: as it is
        with contextlib.redirect_stdout(io.StringIO()) as out:
            h.print_timeline(dump)
        self.assertEqual(out.getvalue(), h.timeline_text(dump))

    def test_plugin_figures(self):
        # As in docs/gpu-runs/2026-12-04-h200-check-2.log, trailing space and all.
        self.assertEqual(h.plugin_figures(self.file("demo.json", DEMO_DUMP), "4294967296"),
                         "cuda_init 0.011006138 s device_lock 0.01171677 s "
                         "device_checkpoint 2.502195995 s (1.72 GB/s) ")
        self.assertEqual(h.plugin_figures(self.file("tree.json", TREE_DUMP), 2147483648),
                         "cuda_init@3511 0.011950926 s device_lock@3518 0.000695283 s "
                         "device_lock@3519 0.000522102 s device_checkpoint@3518 1.127421604 s "
                         "device_checkpoint@3519 0.900155392 s ")
        self.assertEqual(h.plugin_figures(self.file("l.json", CUDA_LOCK), "0"),
                         "cuda_init 0.012315809 s ")
        self.assertEqual(h.plugin_figures(os.path.join(self.tmp, "absent"), "0"),
                         "no device stages")

    def test_device_span(self):
        together = {"timeline": timeline(2.0, stage("device_checkpoint@1", 1.0, start=0.5),
                                         stage("device_checkpoint@2", 0.8, start=0.6),
                                         stage("device_lock@1", 0.1))}
        self.assertEqual(h.device_span(self.file("t.json", together), "device_checkpoint"),
                         "device_checkpoint: 2 processes, 1.800 s added up, 1.000 s wall")
        self.assertEqual(h.device_span(self.file("tree.json", TREE_DUMP), "device_restore"),
                         "no device_restore@PID stages")
        self.assertEqual(h.device_span(os.path.join(self.tmp, "absent"), "device_checkpoint"),
                         "no device_checkpoint@PID stages")

    def test_replies(self):
        self.assertEqual(h.hash_of("OK 3 2eaa32111c38fae9"), "2eaa32111c38fae9")
        self.assertEqual(h.hash_of(""), "")
        self.assertEqual(h.hash_of("ERR"), "")
        info = "pid=703 device=0 uuid=GPU-1 vram_bytes=4294967296"
        self.assertEqual(h.info_field(info, "pid"), "703")
        self.assertEqual(h.info_field(info, "vram_bytes"), "4294967296")
        self.assertEqual(h.info_field(info, "reserved_bytes"), "")
        tree = "pid=3470 device=0 vram_bytes=2147483648 worker_pids=3475,3476"
        self.assertEqual(h.tree_pids(tree), ["3470", "3475", "3476"])
        self.assertEqual(h.tree_pids(""), [])
        said = "the CUDA state of process 703 was restored; process 703 was resumed"
        out = ("gpuckpt: dumping\n"
               f"gpuckpt-guard: gpuckpt ended in the middle of an operation; {said}\n")
        self.assertEqual(h.guard_summary(out), said)
        self.assertEqual(h.guard_summary("nothing\n"), "")

    def test_figures(self):
        self.assertEqual(h.div("4294967296", 1073741824), "4.00")
        self.assertEqual(h.div("", 1073741824), "0.00")
        self.assertEqual(h.div(5, 0), "n/a")
        self.assertEqual(h.gbps("4294967296", "2.278798419"), "1.88")
        self.assertEqual(h.gbps("0", "1"), "n/a")
        self.assertEqual(h.gbps("4294967296", "1e-05"), "429496.73")
        self.assertEqual(h.awk_num("12abc"), 12.0)
        self.assertEqual(h.awk_fields("tmpfs tmpfs 128G 0 128G 0% /dev/shm", 2, 3), "tmpfs 128G")
        self.assertEqual(h.awk_fields("a b", 2, 7), "b ")

    def test_bench_table(self):
        table = h.bench_table(self.file("b.json", BENCH_DUMP)).split("\n")
        self.assertEqual(table[0], "cores 16, write 1.14 GB/s, read 0.86 GB/s, fill 1.92 / huge "
                                   "22.54 GB/s, zstd 0.74 / 2.74 GB/s per core; floors: dump 2.94 "
                                   "s (disk write), restore 3.90 s (disk read)")
        self.assertEqual(table[1], "  stream       dump   2.37 s (0.65x criu, 124% of floor; "
                                   "exited 2.50 s) runs [2.573841856, 2.367519398], restore   "
                                   "2.88 s (1.02x criu, 135% of floor) runs [3.073545928, "
                                   "2.884623096], extra 394 / 239 MiB")
        self.assertIn("Traceback", h.bench_table(self.file("x.json", {"path": {}})))


class SkipsWithoutAGpu(TempDir):
    def records(self, c, stage, **attrs):
        for k, v in attrs.items():
            setattr(c, k, v)
        with contextlib.redirect_stdout(io.StringIO()):
            stage.run(c)
        return c.s.results

    def test_criu(self):
        c = self.context("--no-criu")
        self.assertEqual(self.records(c, stage_criu), [rec("SKIP", "criu", "--no-criu")])
        self.assertFalse(c.criu_ok)
        fake = write(os.path.join(self.tmp, "criu"), "#!/bin/sh\n", 0o755)
        with mock.patch.dict(os.environ, {"GPUCKPT_CRIU": fake}):
            self.assertEqual(self.records(self.context(), stage_criu, plugin_dir=self.tmp), [
                rec("SKIP", "criu", "the CRIU plugin was not built (no criu-plugin.h at "
                                    "configure time)")])
        nowhere = os.path.join(self.tmp, "empty")
        os.makedirs(nowhere)
        with mock.patch.dict(os.environ, {"GPUCKPT_CRIU": "", "GPUCKPT_CRIU_PREFIX": nowhere,
                                          "PATH": nowhere}):
            self.assertEqual(self.records(self.context(), stage_criu), [
                rec("SKIP", "criu", "CRIU is not installed here (scripts/install-criu.sh needs "
                                    "apt)")])

    def test_the_stages_that_need_criu(self):
        c = self.context("--no-torch", "--bench-dump", "4G")
        for s in (stage_torch, stage_demo_criu, stage_dump_killed, stage_tree, stage_bench_dump):
            self.records(c, s, criu_ok=False)
        self.assertEqual(c.s.results, [rec("SKIP", "torch", "--no-torch"),
                                       rec("SKIP", "bench dump", "needs CRIU (above)")])
        c = self.context()
        self.records(c, stage_torch, criu_ok=False)
        self.assertIn(c.s.results, [[rec("SKIP", "torch", "python3 with torch is not installed "
                                                          "here")],
                                    [rec("SKIP", "torch", "needs CRIU (above)")]])
        self.assertEqual(self.records(self.context(), stage_bench_dump, criu_ok=True), [])

    def test_stages_that_do_not_fit_the_budget(self):
        c = self.context("--bench-dump", "4G", budget="10")
        for s in (stage_demo_criu, stage_tree, stage_bench_dump):
            self.records(c, s, criu_ok=True)
        roofline = write(os.path.join(self.tmp, "roofline"), "#!/bin/sh\n", 0o755)
        self.records(c, stage_roofline, roofline=roofline)
        left = "time budget: 10 s left of 10 s, needs"
        self.assertEqual(c.s.results, [rec("SKIP", "demo criu", f"{left} ~90 s"),
                                       rec("SKIP", "cuda tree", f"{left} ~70 s"),
                                       rec("SKIP", "bench dump", f"{left} ~150 s"),
                                       rec("SKIP", "roofline", f"{left} ~60 s")])

    def test_roofline_missing(self):
        missing = os.path.join(self.tmp, "gpuckpt-roofline-gpu")
        self.assertEqual(self.records(self.context(), stage_roofline, roofline=missing), [
            rec("FAIL", "roofline", f"{missing} missing: nvcc was not found when building")])

    def test_the_gpu_test_programs(self):
        tests = os.path.join(self.tmp, "tests")
        os.makedirs(tests)
        write(os.path.join(tests, "device_gpu_test"), textwrap.dedent("""\
            #!/bin/sh
            echo '[       OK ] CudaCheckpoint.LockCheckpointRestoreUnlock (3120 ms)'
            echo '[       OK ] CudaCheckpoint.RestoreWithAnIdentityGpuMap (2001 ms)'
            echo '[  SKIPPED ] CudaCheckpoint.Remap (0 ms)'
            echo '[  SKIPPED ] 1 test, listed below:'
            """), 0o755)
        write(os.path.join(tests, "device_cli_test"), textwrap.dedent("""\
            #!/bin/sh
            echo 'device_cli_test.cpp:40: Failure'
            echo '[  FAILED  ] DevicesCli.X (1 ms)'
            exit 1
            """), 0o755)
        out = os.path.join(self.tmp, "out")
        os.makedirs(out)
        r = self.records(self.context(out_dir=out), stage_tests, tests_dir=tests)
        missing = "not built (GoogleTest missing?): the check is incomplete"
        self.assertRegex(r[0], r"^PASS  device_gpu_test            2 passed, 1 skipped "
                               r"\(\d+\.\d{3} s\)$")
        self.assertEqual(r[1], rec("FAIL", "kernels_binaries_test", missing))
        self.assertRegex(r[2], r"^FAIL  device_cli_test            device_cli_test.cpp:40: "
                               r"Failure \[  FAILED  \] DevicesCli.X \(1 ms\)  "
                               r"\(exit or timeout after \d+\.\d{3} s\)$")
        self.assertEqual(r[3], rec("FAIL", "library_search_test", missing))
        with tarfile.open(os.path.join(out, "results.tar.gz")) as t:
            self.assertIn(b"[  FAILED  ] DevicesCli.X", t.extractfile("./tests.log").read())
        r = self.records(self.context(budget="5"), stage_tests, tests_dir=tests)
        self.assertEqual(r[0], rec("SKIP", "device_gpu_test",
                                   "time budget: 5 s left of 5 s, needs ~20 s"))
        self.assertEqual(self.records(self.context("--no-tests"), stage_tests, tests_dir=tests), [])


class ThpExperiment(TempDir):
    """stage_thp with a fake gpuckpt and a THP control file of its own: every mode is tried,
    the D2H figures come from gpuckpt's timeline, and the machine's mode is put back."""

    FAKE_CUDA = """\
        # gpuckpt --json cuda-checkpoint --pid P --action A [...]: A's stage, 2 s for a checkpoint
        action=; prev=
        for a in "$@"; do [ "$prev" = --action ] && action=$a; prev=$a; done
        echo "$action $(cat "$THP")" >> "$CALLS"
        [ "$action" = "$FAIL_AT" ] && [ "$(cat "$THP")" = "$FAIL_MODE" ] && exit 1
        secs=0.5; [ "$action" = checkpoint ] && secs=2.0
        printf '{"ok":true,"timeline":{"stages":[{"name":"cuda_%s","seconds":%s}]}}' \\
            "$action" "$secs"
        """

    def run_stage(self, original="always [madvise] never", fail_at="", fail_mode=""):
        thp = write(os.path.join(self.tmp, "thp"), original)
        calls = os.path.join(self.tmp, "calls")
        bundle = fake_bundle(os.path.join(self.tmp, "bundle"), self.FAKE_CUDA)
        c = self.context()
        c.gpuckpt = os.path.join(bundle, "bin", "gpuckpt")
        c.demo_pid, c.demo_sock, c.vram_bytes = str(os.getpid()), "sock", "4000000000"
        c.hash_before, c.d2h = "abc", "55.0"
        env = {"THP": thp, "CALLS": calls, "FAIL_AT": fail_at, "FAIL_MODE": fail_mode}
        with mock.patch.object(stage_thp, "THP_ENABLED", thp), \
                mock.patch.object(stage_thp, "first_touch_gbps", return_value=1.9), \
                mock.patch.object(c, "ask", return_value="OK 4000000000 abc"), \
                mock.patch.dict(os.environ, env), \
                contextlib.redirect_stdout(io.StringIO()):
            stage_thp.run(c)
        return c, h.read_text(thp), h.read_text(calls).splitlines()

    def test_the_selected_mode_is_read(self):
        self.assertEqual(stage_thp.thp_mode("always [madvise] never\n"), "madvise")
        self.assertEqual(stage_thp.thp_mode("[always] madvise never"), "always")
        self.assertEqual(stage_thp.thp_mode(""), "")

    def test_every_mode_is_measured_and_the_mode_is_put_back(self):
        c, thp, calls = self.run_stage()
        self.assertEqual(thp, "madvise")
        self.assertEqual(c.thp_restore, "")
        self.assertEqual([line.split()[1] for line in calls if line.startswith("checkpoint")],
                         ["madvise", "always", "never"])
        info = [r for r in c.s.results if r.startswith("INFO")]
        self.assertEqual(len(info), 1)
        self.assertIn("always: first touch 1.90 GB/s, D2H 2.00 GB/s in 2.0 s, H2D 8.00 GB/s in "
                      "0.5 s", info[0])
        self.assertIn("(pinned D2H ceiling 55.0 GB/s)", info[0])
        self.assertIn(rec("PASS", "vram hash (thp)", "identical after 3 rounds: abc"), c.s.results)

    def test_a_failed_step_resumes_the_server_and_still_puts_the_mode_back(self):
        c, thp, calls = self.run_stage(original="[always] madvise never", fail_at="checkpoint",
                                       fail_mode="always")
        self.assertEqual(thp, "always")
        self.assertEqual(calls[-3:], ["checkpoint always", "restore always", "unlock always"])
        self.assertTrue(any(r.startswith("FAIL  thp always") for r in c.s.results), c.s.results)
        self.assertFalse(any("never" in line for line in calls), calls)

    def test_without_the_server_or_a_thp_control_it_skips_with_the_reason(self):
        c = self.context()
        with contextlib.redirect_stdout(io.StringIO()):
            stage_thp.run(c)
        self.assertEqual(c.s.results, [rec("SKIP", "thp d2h", "the CUDA demo server is not running")])
        c = self.context()
        c.demo_pid = str(os.getpid())
        missing = os.path.join(self.tmp, "no-thp")
        with mock.patch.object(stage_thp, "THP_ENABLED", missing), \
                contextlib.redirect_stdout(io.StringIO()):
            stage_thp.run(c)
        self.assertEqual(c.s.results, [rec("SKIP", "thp d2h",
                                           f"no transparent huge page control ({missing})")])


class LockThenKill(TempDir):
    def test_a_restored_process_is_locked_before_it_is_killed(self):
        calls = os.path.join(self.tmp, "calls")
        # The fake records each call and whether its target was still alive when asked to lock.
        gpuckpt = write(os.path.join(self.tmp, "gpuckpt"), textwrap.dedent(f"""\
            #!/bin/sh
            if kill -0 "$3" 2>/dev/null; then alive=alive; else alive=dead; fi
            echo "$* $alive" >> {calls}
            """), 0o755)
        c = self.context()
        c.gpuckpt = gpuckpt
        target = subprocess.Popen(["sleep", "60"])
        gone = subprocess.Popen(["true"])
        gone.wait()
        c.procs[target.pid] = target
        c.lock_then_kill([str(target.pid), str(gone.pid), ""])
        with open(calls) as f:
            self.assertEqual(f.read(), f"cuda-checkpoint --pid {target.pid} --action lock "
                                       "--timeout-ms 5000 alive\n")
        self.assertEqual(target.wait(timeout=10), -signal.SIGKILL)


class Runner(TempDir):
    def run_check(self, *args, script=NO_GPU_GPUCKPT):
        bundle = fake_bundle(os.path.join(self.tmp, "bundle"), script)
        self.out = os.path.join(self.tmp, "out")
        self.work_parent = os.path.join(self.tmp, "t")
        os.makedirs(self.work_parent)
        env = dict(os.environ, OUT=self.out, TMPDIR=self.work_parent)
        env.pop("GPUCKPT_CRIU", None)
        p = subprocess.Popen([sys.executable, RUNNER, "--bundle", bundle, *args], env=env,
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return p, bundle

    def summary(self):
        with open(os.path.join(self.out, "summary.txt")) as f:
            return f.read().split("\n")

    def test_without_a_gpu_it_exits_7_with_the_reason(self):
        p, bundle = self.run_check("--budget-s", "30")
        printed, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 7, printed)
        self.assertEqual(self.summary()[1:4], [rec("PASS", "build", f"prebuilt bundle {bundle}"),
                                               rec("FAIL", "devices", NO_GPU_REASON),
                                               "RESULT: 1 check(s) FAILED"])
        self.assertIn(f"{NO_GPU_REASON}\n", printed)  # gpuckpt devices' own message
        with open(os.path.join(self.out, "gpu-check.log")) as f:
            self.assertEqual(f.read(), printed)
        with tarfile.open(os.path.join(self.out, "results.tar.gz")) as t:
            self.assertEqual(json.load(t.extractfile("./devices.json")), DEVICES_NO_GPU)
        self.assertEqual(os.listdir(self.work_parent), [])  # the work dir is removed

    def test_keep_keeps_the_work_dir(self):
        p, _ = self.run_check("--keep")
        printed, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 7, printed)
        work = os.listdir(self.work_parent)
        self.assertEqual(len(work), 1)
        self.assertIn(f"gpu-check.sh: kept {os.path.join(self.work_parent, work[0])}\n", printed)

    def test_a_missing_bundle_exits_2(self):
        self.out = os.path.join(self.tmp, "out")
        env = dict(os.environ, OUT=self.out, TMPDIR=self.tmp)
        r = subprocess.run([sys.executable, RUNNER, "--bundle", os.path.join(self.tmp, "none")],
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(self.summary()[1],
                         rec("FAIL", "gpu-check.sh", f"bundle {self.tmp}/none does not exist"))

    def test_a_signal_stops_it_after_the_running_command(self):
        started = os.path.join(self.tmp, "started")
        p, _ = self.run_check(script=f"touch {started}; sleep 2; exit 7\n")
        deadline = time.time() + 30
        while not os.path.exists(started) and time.time() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        printed, _ = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 130, printed)
        lines = self.summary()
        self.assertRegex(lines[2], r"^FAIL  gpu-check.sh               stopped by a signal at "
                                   r"\d+ s \(budget 330 s\)$")
        self.assertEqual(lines[3], "RESULT: 1 check(s) FAILED")


if __name__ == "__main__":
    unittest.main()
