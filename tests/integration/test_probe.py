"""The sandbox's start-up probe runs on the event loop like every other child process:
while it is in flight the server answers, check_environment says "probing", and a call
that needs the sandbox waits for the outcome rather than failing or blocking the loop.
A stand-in for bubblewrap holds the probe's first step (`bwrap --version`) until the test
lets it go."""
import os
import shutil
import stat

import pytest

from conftest import Server, descendants, wait_until

BWRAP = shutil.which("bwrap")


@pytest.fixture
def held_bwrap(tmp_path):
    if not BWRAP:
        pytest.skip("bubblewrap is not installed")
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    fake = tmp_path / "bwrap"
    # --version waits for a line on the FIFO (the test writes it), then everything is the
    # real bubblewrap.
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then read line < {gate}; fi\nexec {BWRAP} \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return fake, gate


def release(gate):
    fd = os.open(gate, os.O_WRONLY)
    os.write(fd, b"go\n")
    os.close(fd)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def waiting_in_version(server):
    """Whether the stand-in's --version step is what the server is waiting for."""
    for pid in descendants(server.proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--version" in f.read():
                    return True
        except OSError:
            pass
    return False


def test_calls_wait_for_the_probe_without_blocking_the_loop(held_bwrap):
    fake, gate = held_bwrap
    s = Server("--prestart", "off", backend="bwrap", env={"MPS_BWRAP": str(fake)})
    try:
        s.initialize()
        assert wait_until(lambda: waiting_in_version(s), timeout=20)
        # The probe is held: the loop still answers.
        assert s.request("ping")["result"] == {}
        res = s.call("check_environment")
        assert res["structuredContent"]["sandbox_probing"] is True
        assert "Sandbox status: bubblewrap" in res["content"][0]["text"]
        assert "Sandbox available: probing" in res["content"][0]["text"]
        # A call that needs the sandbox waits for the probe...
        s.send({"jsonrpc": "2.0", "id": "waits", "method": "tools/call",
                "params": {"name": "execute_python", "arguments": {"details": True, "script": "print('ran after the probe')"}}})
        assert s.request("tools/list")["result"]["tools"]
        assert s.request("ping")["result"] == {}
        assert waiting_in_version(s)  # still held: nothing above waited for it
        assert s.stray == []
        release(gate)
        # ...and then runs in it.
        res = s.recv_response("waits", timeout=60)["result"]
        assert res["isError"] is False, res
        assert "ran after the probe" in res["content"][0]["text"]
        assert "--- sandbox: bwrap ---" in res["content"][0]["text"]
        sc = s.probed_environment()["structuredContent"]
        assert sc["sandbox_probing"] is False and sc["sandbox_available"] is True
    finally:
        s.close()


def test_a_server_that_exits_mid_probe_leaves_nothing(held_bwrap):
    fake, gate = held_bwrap
    s = Server(backend="bwrap", env={"MPS_BWRAP": str(fake)})
    s.initialize()
    assert wait_until(lambda: waiting_in_version(s), timeout=20)
    held = descendants(s.proc.pid)
    assert held
    assert s.close() == 0
    # The probe's process was killed and reaped with the server.
    assert wait_until(lambda: not any(alive(p) for p in held), timeout=10)
