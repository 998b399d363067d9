#!/usr/bin/env bash
# Reproduces the profile in bench/README.md ("Where the time goes") for the trivial call on
# the default (bwrap) backend.  Needs bench/run.sh to have built build-bench/ first; uses
# perf and strace (apt-get install linux-perf strace).  Loopback only, bounded.
#
#   bench/profile.sh            # writes bench/results/profile-*.txt
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build-bench/mcp-python-exec-sandbox
out=bench/results
mkdir -p "$out"
tmp=$(mktemp -d /tmp/mps-profile-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# 1. The sandbox's command line, part by part, against the notes' bare bwrap run.
cc -O2 -D_GNU_SOURCE -I. bench/tools/dump_seccomp.c build-bench/libmps_sandbox.a \
   build-bench/libmps_common.a -lseccomp -lcrypto -o "$tmp/dump_seccomp"
"$tmp/dump_seccomp" > "$tmp/filter.bpf"
/usr/bin/python3 bench/tools/ablate_bwrap.py --binary "$bin" --filter "$tmp/filter.bpf" --rounds 40 \
  | tee "$out/profile-ablation.txt"

# 2. The server process alone (no children): CPU per call by symbol, and syscalls per call.
/usr/bin/python3 - "$bin" "$tmp" <<'PY' | tee "$out/profile-server.txt"
import os, subprocess, sys, time
sys.path.insert(0, "bench")
import bench
binary, tmp = sys.argv[1], sys.argv[2]
n = 200
for tool in ("perf", "strace"):
    s = bench.StdioServer(binary, [], os.path.join(tmp, "state-" + tool))
    s.initialize()
    for _ in range(5):
        s.execute("pass")
    if tool == "perf":
        argv = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "10000", "-g", "--no-inherit",
                "-o", os.path.join(tmp, "perf.data"), "-p", str(s.proc.pid)]
    else:
        argv = ["strace", "-c", "-w", "-o", os.path.join(tmp, "strace.txt"), "-p", str(s.proc.pid)]
    t = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    for _ in range(n):
        s.execute("pass")
    t.send_signal(2)
    t.wait()
    s.close()
print(f"== perf: the server process (not its children) over {n} calls of execute_python('pass')")
print(subprocess.run(["perf", "report", "-i", os.path.join(tmp, "perf.data"), "--sort", "dso", "--stdio",
                      "-g", "none", "-F", "overhead,period,dso"], capture_output=True, text=True).stdout)
r = subprocess.run(["perf", "report", "-i", os.path.join(tmp, "perf.data"), "--children", "--sort", "sym",
                    "--stdio", "-g", "none"], capture_output=True, text=True).stdout
print("\n".join([l for l in r.splitlines() if l.strip() and not l.startswith("#")][:45]))
print(f"\n== strace -c -w (wall time in syscalls) of the server process over {n} calls")
print(open(os.path.join(tmp, "strace.txt")).read())
PY

# 3. Work-directory churn on the state directory's file system vs tmpfs.
/usr/bin/python3 - <<'PY' | tee "$out/profile-fs.txt"
import os, shutil, tempfile, time
def cycle(base, n=200):
    os.makedirs(base, exist_ok=True)
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        d = tempfile.mkdtemp(dir=base, prefix="run-")
        with open(d + "/script.py", "w") as f:
            f.write("pass")
        os.unlink(d + "/script.py")
        os.rmdir(d)
        ts.append(time.perf_counter() - t)
    shutil.rmtree(base)
    return sorted(ts)[len(ts) // 2] * 1e6
home = os.path.expanduser("~/.cache/mps-bench-fs-probe")
print(f"mkdtemp + write script.py + unlink + rmdir, median of 200:")
print(f"  {home} (the default state dir's file system): {cycle(home):.0f} us")
print(f"  /dev/shm (tmpfs): {cycle('/dev/shm/mps-bench-fs-probe'):.0f} us")
PY
