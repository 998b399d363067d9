#!/usr/bin/env python3
"""The layer check: every `#include "..."` of the tree's C sources must follow the layer
table below (docs/architecture.md explains it), and no header may include itself back
through others.

  scripts/check-layers.py [ROOT]     check the tree at ROOT (default: the repository)
  scripts/check-layers.py --self-test
                                     prove that a wrong include, an internal header used
                                     from another room and an include cycle are refused

Rules, for a file in room R including a file in room S:
  - S == R: always allowed (a room's own files and its *-internal.h);
  - S must be in R's row of LAYERS (the direction: only down);
  - and the file must be S's public header (PUBLIC), never an internal one.
Files outside every room (tests/, bench/) are not checked: tests may look inside.
Inside a room, files call each other freely (a direct call, never a hook to avoid one).
Exit status 1 with one line per refused edge or cycle.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Room -> the rooms it may use.  A room is a directory of the tree; the deepest match wins
# (server/exec/job.c is in server/exec, server/server.c in server).
LAYERS = {
    "common": [],
    "pystd": ["common"],
    "egress": ["common"],
    "transport": ["common"],
    "sandbox": ["common"],
    "interp": ["sandbox", "pystd", "common"],
    "envstore": ["interp", "sandbox", "egress", "pystd", "common"],
    "server/config": ["egress", "pystd", "common"],
    "server/audit": ["common"],
    "server/files": ["server/config", "common"],
    "server/net": ["server/config", "egress", "sandbox", "common"],
    "server/core": ["server/files", "server/audit", "server/config", "envstore", "interp", "sandbox", "transport", "pystd",
                    "common"],
    "server/exec": ["server/core", "server/net", "server/files", "server/config", "envstore", "interp", "sandbox",
                    "egress", "transport", "pystd", "common"],
    "server/tools": ["server/exec", "server/core", "server/net", "server/files", "server/config", "envstore",
                     "interp", "sandbox", "egress", "transport", "pystd", "common"],
    "server": ["server/tools", "server/exec", "server/core", "server/net", "server/files", "server/config",
               "envstore", "interp", "sandbox", "egress", "transport", "pystd", "common"],
}

# Each room's public header: what another room may include.
PUBLIC = {
    "common": "common/cm.h",
    "pystd": "pystd/pystd.h",
    "egress": "egress/egress.h",
    "transport": "transport/tr.h",
    "sandbox": "sandbox/sbx.h",
    "interp": "interp/interp.h",
    "envstore": "envstore/envstore.h",
    "server/config": "server/config/config.h",
    "server/audit": "server/audit/audit.h",
    "server/files": "server/files/files.h",
    "server/net": "server/net/net.h",
    "server/core": "server/core/core.h",
    "server/exec": "server/exec/exec.h",
    "server/tools": "server/tools/tools.h",
    "server": "server/server.h",
}


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(path):
    best = None
    for room in LAYERS:
        if path == room or path.startswith(room + "/"):
            if best is None or len(room) > len(best):
                best = room
    return best


def sources(root):
    for room in sorted(LAYERS):
        base = os.path.join(root, room)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith((".c", ".h")):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    if room_of(rel) == room:
                        yield rel


def check(root):
    problems = []
    graph = {}
    for rel in sources(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        src_room = room_of(rel)
        edges = []
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            # Includes are relative to the root; a bare name is the file's own directory.
            target = inc if "/" in inc else os.path.join(os.path.dirname(rel), inc)
            if not os.path.exists(os.path.join(root, target)):
                continue  # generated or third-party: not ours to check
            dst_room = room_of(target)
            if dst_room is None:
                problems.append(f"{rel}:{line}: includes {inc}, which is in no room of the layer table")
                continue
            edges.append(target)
            if dst_room == src_room:
                continue
            if dst_room not in LAYERS[src_room]:
                problems.append(f"{rel}:{line}: {src_room}/ may not use {dst_room}/ (includes {inc}); "
                                f"{src_room}/ may use: {', '.join(LAYERS[src_room]) or 'nothing'}")
            elif target != PUBLIC[dst_room]:
                problems.append(f"{rel}:{line}: includes {inc}, not {dst_room}/'s public header "
                                f"{PUBLIC[dst_room]}")
        graph[rel] = edges
    # Cycles between files: a header that reaches itself through the headers it includes.
    state = {}
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                problems.append("include cycle: " + " -> ".join(cycle))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return problems


def self_test():
    me = os.path.abspath(__file__)
    root = os.path.dirname(os.path.dirname(me))
    failures = []

    def run(tree):
        p = subprocess.run([sys.executable, me, tree], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr

    with tempfile.TemporaryDirectory(prefix="mps-layers-") as tmp:
        for rel in sources(root):
            dst = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(root, rel), dst)
        rc, out = run(tmp)
        if rc != 0:
            failures.append("the tree as it is was refused:\n" + out)

        def mutate(rel, line, expect):
            path = os.path.join(tmp, rel)
            with open(path, encoding="utf-8") as f:
                orig = f.read()
            with open(path, "w", encoding="utf-8") as f:
                f.write(line + "\n" + orig)
            rc, out = run(tmp)
            with open(path, "w", encoding="utf-8") as f:
                f.write(orig)
            if rc == 0 or expect not in out:
                failures.append(f"{line!r} in {rel} was not refused with {expect!r} (exit {rc}):\n{out}")

        # Upward: the sandbox may not know the server.
        mutate("sandbox/run.c", '#include "server/core/core.h"', "sandbox/ may not use server/core/")
        # Sideways: the transport may not know the sandbox.
        mutate("transport/stdio.c", '#include "sandbox/sbx.h"', "transport/ may not use sandbox/")
        # Down, but into another room's internals.
        mutate("server/tools/table.c", '#include "server/exec/exec-internal.h"', "not server/exec/'s public header")
        # A cycle between headers.
        mutate("server/exec/exec.h", '#include "server/exec/exec-internal.h"', "include cycle")
    if failures:
        print("check-layers self-test FAILED:\n" + "\n".join(failures))
        return 1
    print("check-layers self-test: a wrong include, an internal header and an include cycle are refused")
    return 0


def main(argv):
    if argv[1:2] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} refused (the layer table is in scripts/check-layers.py "
              "and docs/architecture.md)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
