"""Build what the check needs in the build directory, or use a bundle; and --make-bundle, which
builds one on a dev machine for a GPU machine without the build dependencies."""

import fnmatch
import glob
import os
import shutil
import sys

import helpers as h
from context import DEVNULL, GPU_TESTS, STDOUT

# Every target system has these (newer): a bundle does not carry them.
SYSTEM_LIBS = ("libc.so*", "libm.so*", "libpthread.so*", "libdl.so*", "librt.so*", "ld-linux*",
               "libstdc++.so*", "libgcc_s.so*")


def configure_and_build(c, tests, limit):
    c.say(f"configuring {c.build} (Release, tests={tests})")
    if c.run(["cmake", "-S", c.here, "-B", c.build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
              "-DGPUCKPT_BUILD_BENCH=OFF", f"-DGPUCKPT_BUILD_TESTS={tests}"],
             timeout=300, out=c.path("cmake.log"), err=STDOUT) != 0:
        return False
    targets = ["gpuckpt"]
    c.run(["ninja", "-C", c.build, "-t", "targets", "all"], out=c.path("targets.txt"), err=DEVNULL)
    known = h.read_text(c.path("targets.txt")).split("\n")
    for t in ["gpuckpt-roofline-gpu", "gpuckpt-cuda-demo-server", "gpuckpt_criu_plugin",
              *GPU_TESTS]:
        if any(line.startswith(t + ":") for line in known):
            targets.append(t)
    c.say(f"building {' '.join(targets)} (-j{c.o.jobs}, at most {limit} s)")
    return c.run(["ninja", "-C", c.build, "-j", c.o.jobs, *targets], timeout=limit,
                 out=c.path("build.log"), err=STDOUT) == 0


def build_all(c, limit):
    t0 = h.now()
    if not shutil.which("cmake") or not shutil.which("ninja"):
        c.die(1, "cmake and ninja are needed to build here (or use --bundle, see --make-bundle)")
    logs = [c.path("cmake.log"), c.path("build.log")]
    if not configure_and_build(c, "ON", limit):
        # A build without the tests still lets the other checks run, but is never a PASS: the
        # GPU tests would be missing (a timeout is the usual cause on a small machine).
        c.run(["tail", "-n", "15", *logs], err=DEVNULL)
        c.record("FAIL", "build",
                 f"the build with the GPU tests failed or passed {limit} s (log above)")
        if c.o.make_bundle or not configure_and_build(c, "OFF", limit):
            c.run(["tail", "-n", "25", *logs], err=DEVNULL)
            c.die(1, "build failed (log above). On a machine without gpuckpt's build "
                  "dependencies (liburing, zstd, xxhash, spdlog, CLI11, nlohmann-json), build a "
                  "bundle on a dev machine: scripts/gpu-check.sh --make-bundle gpu-bundle, then "
                  "run scripts/gpu-check.sh --bundle gpu-bundle here")
        c.record("INFO", "build", f"built without the tests in {c.build} ({h.elapsed(t0)} s)")
    else:
        c.record("PASS", "build", f"Release build in {c.build} ({h.elapsed(t0)} s)")
    c.bin = os.path.join(c.build, "bin")
    c.plugin_dir = os.path.join(c.build, "lib/gpuckpt/criu")
    c.tests_dir = os.path.join(c.build, "tests")


def _executable(path):
    return os.access(path, os.X_OK)


def make_bundle(c, dest):
    # No GPU and no time limit of the device here, but a bounded build all the same.
    build_all(c, os.environ.get("GPUCKPT_BUNDLE_BUILD_TIMEOUT") or "5400")
    h.rm_rf(dest)
    for d in ("bin", "lib/gpuckpt", "tests", "deps"):
        os.makedirs(os.path.join(dest, d), exist_ok=True)
    dest_bin, dest_lib, dest_tests = (os.path.join(dest, d) + "/"
                                      for d in ("bin", "lib/gpuckpt", "tests"))
    programs = ("gpuckpt", "gpuckpt-roofline-gpu", "gpuckpt-cuda-demo-server")
    if c.run(["cp", "-L", *(os.path.join(c.bin, p) for p in programs), dest_bin]) != 0:
        c.die(1, "the kernels were not built (nvcc missing?)")
    # The guard process and any other helper gpuckpt runs from its bin/.
    for f in sorted(glob.glob(os.path.join(c.bin, "*"))):
        if (os.path.isfile(f) and _executable(f)
                and not os.path.exists(os.path.join(dest_bin, os.path.basename(f)))):
            c.run(["cp", "-L", f, dest_bin])
    c.run(["cp", "-L", os.path.join(c.build, "lib/gpuckpt/kernels.manifest"), dest_lib],
          err=DEVNULL)
    if os.path.isdir(c.plugin_dir):
        c.run(["cp", "-rL", c.plugin_dir, dest_lib])
    missing = []
    for f in GPU_TESTS:
        if _executable(os.path.join(c.tests_dir, f)):
            c.run(["cp", "-L", os.path.join(c.tests_dir, f), dest_tests])
        else:
            missing.append(f)
    # The libcuda.so.1 library_search_test plants, beside the real driver there.
    if os.path.isdir(os.path.join(c.tests_dir, "planted")):
        c.run(["cp", "-rL", os.path.join(c.tests_dir, "planted"), dest_tests])
    if missing:
        c.record("FAIL", "bundle",
                 f"test programs missing: {' '.join(missing)} (GoogleTest not found?)")
    if not os.path.isfile(os.path.join(dest, "lib/gpuckpt/criu/gpuckpt_criu_plugin.so")):
        c.record("FAIL", "bundle", "the CRIU plugin was not built (criu-plugin.h missing: "
                 "scripts/install-criu.sh)")
    # Shared libraries beyond glibc and the C++ runtime, CRIU's included (a native build:
    # libprotobuf-c, libnl, libnet, gnutls, nftables ...).
    criu_prefix = os.environ.get("GPUCKPT_CRIU_PREFIX") or "/opt/gpuckpt-criu"
    libs = set()
    for f in [*sorted(glob.glob(dest_bin + "*")), *sorted(glob.glob(dest_tests + "*")),
              os.path.join(criu_prefix, "bin/criu")]:
        if os.path.isfile(f):
            for line in c.output(["ldd", f], err=DEVNULL).split("\n"):
                if "=> /" in line:
                    libs.add(h.awk_fields(line, 3))
    for lib in sorted(libs):
        if not any(fnmatch.fnmatchcase(os.path.basename(lib), p) for p in SYSTEM_LIBS):
            c.run(["cp", "-L", lib, os.path.join(dest, "deps/")])
    # Debug symbols are most of the size; the device tool carries 64 MiB in all.
    if shutil.which("strip"):
        c.run(["find", *(os.path.join(dest, d) for d in ("bin", "tests", "deps", "lib")),
               "-type", "f", "(", "-perm", "-u+x", "-o", "-name", "*.so*", ")",
               "-exec", "strip", "--strip-debug", "{}", "+"], err=DEVNULL)
    # The tests find the binaries by the build directory compiled into them.
    with open(os.path.join(dest, "origin"), "w") as f:
        f.write(c.build + "\n")
    if _executable(os.path.join(criu_prefix, "bin/criu")):
        parts = ["bin"] + [p for p in ("root", "lib")
                           if os.path.isdir(os.path.join(criu_prefix, p))]
        c.run(["tar", "-C", criu_prefix, "-czf", os.path.join(dest, "criu.tar.gz"), *parts])
    else:
        c.record("INFO", "bundle",
                 f"no CRIU at {criu_prefix}: the bundle checks the CUDA path only")
    size = int(h.awk_num(c.output(["du", "-sm", dest]).split("\t")[0]))
    nlibs = sum(len(files) for _, _, files in os.walk(os.path.join(dest, "deps")))
    extra = ", CRIU" if os.path.isfile(os.path.join(dest, "criu.tar.gz")) else ""
    if size > 60:
        c.record("FAIL", "bundle", f"{dest} is {size} MiB: the device tool carries 64 MiB at most")
    elif c.s.failures == 0:
        c.record("PASS", "bundle", f"{dest}: {size} MiB ({nlibs} libraries{extra})")
    shown = dest[len(c.here) + 1:] if dest.startswith(c.here + "/") else dest
    c.say(f"on the GPU machine, from the repository root: scripts/gpu-check.sh --bundle {shown}")


def use_bundle(c):
    bundle = c.o.bundle
    if not os.path.isdir(bundle):
        c.die(2, f"bundle {bundle} does not exist")
    d = os.path.normpath(os.path.join(c.pwd, bundle))
    if not _executable(os.path.join(d, "bin/gpuckpt")):
        c.die(2, f"{d} is not a bundle made by --make-bundle")
    # For gpuckpt, criu (which gpuckpt runs) and the tests; python3 keeps the machine's own
    # (Context.py_env).
    old = os.environ.get("LD_LIBRARY_PATH", "")
    os.environ["LD_LIBRARY_PATH"] = os.path.join(d, "deps") + (f":{old}" if old else "")
    c.bin = os.path.join(d, "bin")
    c.plugin_dir = os.path.join(d, "lib/gpuckpt/criu")
    c.tests_dir = os.path.join(d, "tests")
    origin = h.cat(os.path.join(d, "origin"))
    if origin and not os.path.exists(origin):
        try:
            os.makedirs(os.path.dirname(origin) or ".", exist_ok=True)
            os.symlink(d, origin)
            c.children_links.append(origin)
        except OSError as e:
            print(f"ln: {origin}: {e.strerror}", file=sys.stderr, flush=True)
    if os.path.isfile(os.path.join(d, "criu.tar.gz")) and not os.environ.get("GPUCKPT_CRIU"):
        os.makedirs(c.path("criu"), exist_ok=True)
        if c.run(["tar", "-C", c.path("criu"), "-xzf", os.path.join(d, "criu.tar.gz")]) == 0:
            os.environ["GPUCKPT_CRIU"] = c.path("criu/bin/criu")
    c.record("PASS", "build", f"prebuilt bundle {d}")


def run(c):
    if c.o.bundle:
        use_bundle(c)
    else:
        build_all(c, c.cap(240))
