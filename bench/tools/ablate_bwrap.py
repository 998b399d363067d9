#!/usr/bin/python3
"""Where the per-call time of execute_python("pass") goes, on the bwrap backend.

Rebuilds the server's bwrap command line (sandbox/bwrap.c bwrap_build, as root) outside the
server and times it bare, whole and with one part left out at a time, interleaved with the
real server call and the notes' bare bwrap run.  The difference "server call - same argv
bare" is what the server adds around bwrap (work directory, chown, spawn, pipes, reaping,
JSON); "same argv bare - notes' bare bwrap" is what the sandbox's extra parts cost.

    /usr/bin/python3 bench/tools/ablate_bwrap.py [--binary B] [--rounds N] [--filter F]

--filter is a seccomp BPF file (bench/run.sh --profile writes one with dump_seccomp.c);
without it the seccomp variants are skipped.
"""
import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import bench  # noqa: E402

UID = 2100000123
NET_ETC = ["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf",
           "/etc/services", "/etc/protocols", "/etc/ssl/certs", "/etc/ssl/openssl.cnf", "/etc/ca-certificates"]
ENV = ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PYTHONUNBUFFERED=1",
       "PYTHONDONTWRITEBYTECODE=1", "PYTHONIOENCODING=utf-8", "MPLBACKEND=Agg"]


def parents(path, made):
    out = []
    parts = path.strip("/").split("/")[:-1]
    cur = ""
    for p in parts:
        cur += "/" + p
        if cur not in made:
            made.add(cur)
            out += ["--perms", "0755", "--dir", cur]
    return out


def system_args(made):
    a = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            a += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            a += ["--ro-bind", top, top]
    a += parents("/etc/", made)
    for f in ("/etc/ld.so.cache", "/etc/localtime"):
        a += etc_file(f, made)
    return a


def etc_file(path, made):
    if os.path.islink(path):
        t = os.readlink(path)
        if t.startswith("/usr/"):
            return parents(path, made) + ["--symlink", t, path]
    if not os.path.exists(path):
        return []
    return parents(path, made) + ["--ro-bind-try", path, path]


class Variant:
    def __init__(self, name, **opts):
        self.name = name
        self.o = {"seccomp": True, "drop": True, "network": True, "remount": True, "etc": True,
                  "tmpfs": True, "files": True, "unshare_net": False, **opts}


def build(v, ctx):
    """argv and the fds to open for one run of variant v."""
    o = v.o
    made = {"/etc", "/tmp"}
    fds = {}
    a = [ctx["bwrap"], "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup"]
    if o["unshare_net"]:
        a.append("--unshare-net")
    a += ["--as-pid-1", "--die-with-parent", "--hostname", "sandbox", "--clearenv"]
    for e in ENV:
        k, val = e.split("=", 1)
        a += ["--setenv", k, val]
    made2 = set()
    sys_a = system_args(made2) if o["etc"] else ["--ro-bind", "/usr", "/usr"] + [
        x for top in ("/bin", "/sbin", "/lib", "/lib64") if os.path.islink(top)
        for x in ("--symlink", os.readlink(top), top)]
    a += sys_a
    if o["network"] and o["etc"]:
        m = {"/etc"}
        for f in NET_ETC:
            a += etc_file(f, m)
    if o["files"]:
        if not o["network"] or o["unshare_net"]:
            fds["hosts"] = ctx["hosts"]
            a += ["--perms", "0644", "--file", "{hosts}", "/etc/hosts"]
        fds["passwd"] = ctx["passwd"]
        fds["group"] = ctx["group"]
        a += ["--perms", "0644", "--file", "{passwd}", "/etc/passwd", "--perms", "0644", "--file", "{group}", "/etc/group"]
    a += ["--proc", "/proc", "--dev", "/dev"]
    if o["tmpfs"]:
        a += ["--size", "67108864", "--perms", "01777", "--tmpfs", "/dev/shm",
              "--size", "536870912", "--perms", "01777", "--tmpfs", "/tmp"]
    a += parents(ctx["prefix"] + "/", made) if False else []
    made3 = {"/etc", "/tmp"}
    a += parents(ctx["prefix"], made3) + ["--ro-bind", ctx["prefix"], ctx["prefix"]]
    if o["drop"]:
        a += parents("/run/mps-sandbox-drop", made3) + ["--ro-bind", ctx["drop"], "/run/mps-sandbox-drop"]
    a += ["--bind", ctx["workdir"], "/work", "--chdir", "/work"]
    if o["remount"]:
        a += ["--remount-ro", "/"]
    if o["seccomp"] and ctx["filter"]:
        fds["seccomp"] = ctx["filter"]
        a += ["--seccomp", "{seccomp}"]
    a.append("--")
    if o["drop"]:
        a += ["/run/mps-sandbox-drop", "--uid", str(UID), "--gid", str(UID), "--status-fd", "{status}",
              "--control-fd", "{control}", "--as", str(2 << 30), "--nproc", "256", "--fsize", str(1 << 30),
              "--nofile", "1024", "--"]
    a += [ctx["python"], "-s", "script.py"]
    return a, fds


def run_variant(v, ctx, spawner):
    argv, files = build(v, ctx)
    opened = {}
    for k, path in files.items():
        fd = os.open(path, os.O_RDONLY)
        os.set_inheritable(fd, True)
        opened[k] = fd
    keep = []
    if v.o["drop"]:
        sr, sw = os.pipe()
        cr, cw = os.pipe()
        os.set_inheritable(sw, True)
        os.set_inheritable(cr, True)
        opened["status"], opened["control"] = sw, cr
        keep = [sr, cw]
    argv = [x.format(**opened) if "{" in x else x for x in argv]
    try:
        return spawner.run(argv, {})
    finally:
        for fd in list(opened.values()) + keep:
            os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "build-bench", "mcp-python-exec-sandbox"))
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--filter", default=None, help="seccomp BPF file (from dump_seccomp)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="mps-ablate-")
    os.chmod(tmp, 0o755)
    spawner = bench.Spawner()
    try:
        s = bench.StdioServer(args.binary, [], os.path.join(tmp, "state"))
        s_off = bench.StdioServer(args.binary, ["--network", "off"], os.path.join(tmp, "state-off"))
        s.initialize()
        s_off.initialize()
        res, _ = s.execute("pass")
        s_off.execute("pass")
        py = res["structuredContent"]["python"]["path"]
        prefix = os.path.dirname(os.path.dirname(py))
        work = os.path.join(tmp, "work")
        os.mkdir(work)
        with open(os.path.join(work, "script.py"), "w") as f:
            f.write("pass")
        os.chown(work, UID, UID)
        os.chown(os.path.join(work, "script.py"), UID, UID)
        for name, text in (("passwd", f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{UID}:{UID}:sandbox:/work:/usr/sbin/nologin\n"),
                           ("group", f"root:x:0:\nsandbox:x:{UID}:\n"),
                           ("hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n")):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        ctx = {"bwrap": shutil.which("bwrap"), "python": py, "prefix": prefix, "workdir": work,
               "drop": os.path.join(os.path.dirname(os.path.abspath(args.binary)), "mps-sandbox-drop"),
               "filter": args.filter, "passwd": os.path.join(tmp, "passwd"), "group": os.path.join(tmp, "group"),
               "hosts": os.path.join(tmp, "hosts")}
        variants = [
            Variant("server argv, network on (as the server runs it)"),
            Variant("  without seccomp", seccomp=False),
            Variant("  without the drop helper", drop=False),
            Variant("  without the 10 network /etc binds", network=False),
            Variant("  without --remount-ro /", remount=False),
            Variant("  without /dev/shm and /tmp tmpfs", tmpfs=False),
            Variant("  without --file passwd/group", files=False),
            Variant("  minimal: no /etc, tmpfs, files, seccomp, drop, remount", seccomp=False, drop=False, network=False,
                    remount=False, etc=False, tmpfs=False, files=False),
            Variant("server argv, network off (--unshare-net)", network=False, unshare_net=True),
        ]
        if not args.filter:
            variants = [v for v in variants if v.name.strip() != "without seccomp"]
        cmds = {v.name: (lambda v=v: run_variant(v, ctx, spawner)) for v in variants}
        cmds["bare bwrap (notes argv)"] = lambda: spawner.run([ctx["bwrap"], *bench.BARE_BWRAP, py, "-c", "pass"], {})
        cmds["bare python"] = lambda: spawner.run([py, "-c", "pass"], {})
        cmds["server call, network on"] = lambda: s.execute("pass")[1]
        cmds["server call, network off"] = lambda: s_off.execute("pass")[1]
        rng = random.Random(3)
        names = list(cmds)
        for nm in names:  # warm-up, and a check that each variant works
            cmds[nm]()
        t = {nm: [] for nm in names}
        for _ in range(args.rounds):
            rng.shuffle(names)
            for nm in names:
                t[nm].append(cmds[nm]())
        base = statistics.median(t["server argv, network on (as the server runs it)"])
        print(f"{'variant':62} {'median':>9} {'vs server argv':>15}")
        order = [v.name for v in variants] + ["bare bwrap (notes argv)", "bare python", "server call, network on",
                                              "server call, network off"]
        for nm in order:
            m = statistics.median(t[nm])
            print(f"{nm:62} {m * 1e3:8.2f}ms {(m - base) * 1e3:+14.2f}ms")
        s.close()
        s_off.close()
    finally:
        bench.kill_started()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
