#!/usr/bin/env python3
"""A swarm replica's launcher (deploy/swarm/stack.yml): runs the replica's server in a
container of the node's own engine with what bubblewrap needs, which a swarm service cannot
be given (`docker service create` has no --security-opt: no seccomp profile, no unmasked
/proc).

The service's task (this process, in the server's image, with the node's docker socket) asks
the engine for one container per slot, named MPS_LAUNCH_NAME, with exactly the settings of
docs/operations.md ("Docker swarm"): root in the container with the capabilities the
bubblewrap backend needs as root (a uid of its own per run) and no others, the
seccomp-bwrap.json profile, /proc unmasked, no-new-privileges, the host's network (the
slot's port on loopback).  The tokens file (the swarm secret this task sees) is copied into
the container before it starts, 0400 root: the server reads it, no script sees it (the
sandbox shows a run nothing of /run).

It streams the container's output as its own (docker service logs), forwards SIGTERM as a
stop with the drain's grace, removes the container when it ends, and exits with its status,
so swarm's health checks, restarts and rolling updates act on the replica.  A container left
by a launcher that was killed is removed by the next one of the slot (same name).

Environment (stack.yml sets it): MPS_LAUNCH_NAME, MPS_REPLICA_IMAGE, MPS_SLOT, MPS_PORT_BASE,
MPS_HOST, MPS_DRAIN_SECONDS, MPS_EXTRA_ARGS, MPS_STOP_SECONDS (the stop's grace, default 40),
MPS_REPLICA_MEMORY (e.g. 4g; default none), MPS_REPLICA_CPUS (e.g. 2; default none),
MPS_SECCOMP_PROFILE (default /etc/mcp-python-exec-sandbox/seccomp-bwrap.json), and
MPS_LAUNCH_TOKENS (default /run/secrets/mcp_tokens).
"""
import http.client
import io
import json
import os
import signal
import socket
import struct
import sys
import tarfile
import threading
import urllib.parse

SOCKET = "/var/run/docker.sock"
API = "/v1.41"
LABEL = "io.github.mcp-python-exec-sandbox.replica-of"
# What bubblewrap as root needs (docs/operations.md, section 4's unit has the same set but
# CAP_SYS_RESOURCE, which only raises hard limits: the runs' limits are lowered).
CAPS = ["SYS_ADMIN", "SYS_CHROOT", "SETUID", "SETGID", "SETPCAP", "CHOWN", "FOWNER",
        "DAC_OVERRIDE", "DAC_READ_SEARCH", "KILL", "NET_ADMIN", "NET_RAW"]


class Conn(http.client.HTTPConnection):
    def __init__(self, timeout=None):
        super().__init__("localhost", timeout=timeout)

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(SOCKET)
        self.sock = s


def api(method, path, body=None, raw=None, ctype="application/json", timeout=120, ok=(200, 201, 204, 304)):
    c = Conn(timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, API + path, body=data, headers={"Content-Type": ctype})
    r = c.getresponse()
    out = r.read()
    c.close()
    if r.status not in ok:
        raise RuntimeError(f"{method} {path}: {r.status} {out[:300].decode(errors='replace')}")
    return json.loads(out) if out and r.getheader("Content-Type", "").startswith("application/json") else None


def log(msg):
    print(f"mps-launch: {msg}", file=sys.stderr, flush=True)


def tokens_tar(path):
    """The tokens file as run/mps/tokens (0400 root) in a tar archive, for PUT .../archive."""
    with open(path, "rb") as f:
        data = f.read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo("run/mps")
        d.type, d.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(d)
        info = tarfile.TarInfo("run/mps/tokens")
        info.size, info.mode = len(data), 0o400
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def stream_logs(cid):
    """The container's stdout and stderr, as ours (the engine's multiplexed stream)."""
    c = Conn(None)
    c.request("GET", f"{API}/containers/{cid}/logs?follow=1&stdout=1&stderr=1")
    r = c.getresponse()
    outs = {1: sys.stdout.buffer, 2: sys.stderr.buffer}
    while True:
        head = r.read(8)
        if len(head) < 8:
            return
        kind, size = struct.unpack(">BxxxI", head)
        chunk = r.read(size)
        out = outs.get(kind, sys.stdout.buffer)
        out.write(chunk)
        out.flush()


def size(text):
    """'4g' -> bytes (k, m, g suffixes); '' -> 0 (no limit)."""
    text = text.strip().lower()
    if not text:
        return 0
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1], 1)
    return int(float(text.rstrip("kmg")) * mult)


def apparmor_enabled():
    try:
        with open("/sys/module/apparmor/parameters/enabled") as f:
            return f.read().strip() == "Y"
    except OSError:
        return False


def main():
    name = os.environ["MPS_LAUNCH_NAME"]
    image = os.environ["MPS_REPLICA_IMAGE"]
    slot = os.environ["MPS_SLOT"]
    port = int(os.environ.get("MPS_PORT_BASE", "18200")) + int(slot)
    stop_s = int(os.environ.get("MPS_STOP_SECONDS", "40"))
    with open(os.environ.get("MPS_SECCOMP_PROFILE", "/etc/mcp-python-exec-sandbox/seccomp-bwrap.json")) as f:
        seccomp = json.dumps(json.load(f))
    # A container of this slot left by a launcher that was killed: it holds the port.
    api("DELETE", f"/containers/{urllib.parse.quote(name)}?force=1&v=1", ok=(204, 404))
    extra = os.environ.get("MPS_EXTRA_ARGS", "")
    env = [
        f"MPS_HOST={os.environ.get('MPS_HOST', '127.0.0.1')}",
        f"MPS_PORT={port}",
        "MPS_SANDBOX_BACKEND=bwrap",
        f"MPS_DRAIN_SECONDS={os.environ.get('MPS_DRAIN_SECONDS', '30')}",
        "MPS_TOKEN_FILE=/run/mps/tokens",
        # The replica's route is its slot's (nginx.conf's sN): every id it hands out says so.
        f"MPS_EXTRA_ARGS=--route s{slot} {extra}".strip(),
    ]
    security = [f"seccomp={seccomp}", "no-new-privileges"]
    # The engine's default AppArmor profile (docker-default) refuses mounts: where the node
    # has AppArmor, the replica runs unconfined by it (as `docker run --security-opt
    # apparmor=unconfined`, deploy/container/Dockerfile's comment).
    if apparmor_enabled():
        security.append("apparmor=unconfined")
    created = api("POST", f"/containers/create?name={urllib.parse.quote(name)}", {
        "Image": image,
        "Env": env,
        "User": "0:0",
        "Labels": {LABEL: name},
        "HostConfig": {
            "NetworkMode": "host",
            "CapDrop": ["ALL"],
            "CapAdd": CAPS,
            "SecurityOpt": security,
            # systempaths=unconfined: bubblewrap mounts a fresh /proc for each run.
            "MaskedPaths": [],
            "ReadonlyPaths": [],
            "RestartPolicy": {"Name": "no"},
            "Memory": size(os.environ.get("MPS_REPLICA_MEMORY", "")),
            "NanoCpus": int(float(os.environ.get("MPS_REPLICA_CPUS", "0") or 0) * 1e9),
        },
    })
    cid = created["Id"]
    stopping = threading.Event()

    def on_term(signum, frame):
        if stopping.is_set():
            return
        stopping.set()
        log(f"stopping {name} (its server drains, up to {stop_s} s)")
        threading.Thread(target=lambda: api("POST", f"/containers/{cid}/stop?t={stop_s}", timeout=stop_s + 30,
                                            ok=(204, 304, 404)), daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        api("PUT", f"/containers/{cid}/archive?path=/", raw=tokens_tar(os.environ.get("MPS_LAUNCH_TOKENS", "/run/secrets/mcp_tokens")),
            ctype="application/x-tar")
        api("POST", f"/containers/{cid}/start")
        log(f"started {name} ({cid[:12]}) on port {port}")
        threading.Thread(target=stream_logs, args=(cid,), daemon=True).start()
        status = api("POST", f"/containers/{cid}/wait", timeout=None)["StatusCode"]
        log(f"{name} exited {status}")
        return status
    finally:
        api("DELETE", f"/containers/{cid}?force=1&v=1", ok=(204, 404))


if __name__ == "__main__":
    sys.exit(main())
