import json, signal, time
from conftest import processes_with_marker, wait_until
from test_tasks import modern_req, modern_params, next_task_note, sleeper, SUB


def listen(s, lid, ids):
    s.send({"jsonrpc": "2.0", "id": lid, "method": "subscriptions/listen",
            "params": modern_params({"notifications": {"taskIds": ids}})})
    while True:
        m = s.recv(timeout=30)
        if m.get("method") == "notifications/subscriptions/acknowledged" and m["params"]["_meta"][SUB] == lid:
            return m["params"]["notifications"]
        s.stray.append(m)


def test_eight_streams_64_ids(make_server):
    s = make_server("--kill-grace-seconds", "1")
    tid = modern_req(s, 1, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\ntime.sleep(2)\nprint('x'*50000)", "timeout_seconds": 120}})["result"]["taskId"]
    for i in range(8):
        assert listen(s, f"L{i}", [tid] * 64) == {"taskIds": [tid]}
    # a ninth is refused
    s.send({"jsonrpc": "2.0", "id": "L9", "method": "subscriptions/listen",
            "params": modern_params({"notifications": {"taskIds": [tid]}})})
    deadline = time.monotonic() + 60
    seen = {}
    got9 = None
    while time.monotonic() < deadline and (sum(len(v) for v in seen.values()) < 16 or got9 is None):
        m = s.recv(timeout=60)
        print("MSG", json.dumps(m)[:200])
        if m.get("id") == "L9":
            got9 = m
            continue
        if m.get("method") == "notifications/tasks":
            seen.setdefault(m["params"]["_meta"][SUB], []).append(m["params"]["status"])
    assert got9["error"]["code"] == -32600, got9
    assert seen == {f"L{i}": ["working", "completed"] for i in range(8)}, seen
    # nothing more
    try:
        m = s.recv(timeout=2)
        assert m.get("method") != "notifications/tasks", m
    except Exception:
        pass


def test_expiry_while_watched(make_server):
    s = make_server("--kill-grace-seconds", "1", "--max-task-ttl", "3")
    marker = f"mps-scratch-{time.monotonic_ns()}"
    tid = modern_req(s, 1, "tools/call", {"name": "execute_python", "arguments": {
        "script": sleeper(marker), "timeout_seconds": 120}})["result"]["taskId"]
    assert listen(s, "L", [tid]) == {"taskIds": [tid]}
    assert next_task_note(s, "L")["status"] == "working"
    n = next_task_note(s, "L", timeout=30)
    assert n["status"] == "cancelled" and "TTL" in n["statusMessage"], n
    assert wait_until(lambda: not processes_with_marker(marker), 15)
    assert listen(s, "L2", [tid]) == {"taskIds": []}
    r = modern_req(s, 2, "tasks/get", {"taskId": tid})
    assert "error" in r


def test_drain_while_watching(make_server):
    s = make_server("--kill-grace-seconds", "1", "--drain-seconds", "20")
    tid = modern_req(s, 1, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\ntime.sleep(3)\nprint('ok')", "timeout_seconds": 120}})["result"]["taskId"]
    assert listen(s, "L", [tid]) == {"taskIds": [tid]}
    assert next_task_note(s, "L")["status"] == "working"
    s.proc.send_signal(signal.SIGTERM)
    end = s.recv_response("L", timeout=30)
    assert end["result"]["_meta"][SUB] == "L", end
    msgs = []
    try:
        while True:
            m = s.recv(timeout=10)
            if m is None:
                break
            msgs.append(m)
    except Exception as e:
        print("recv ended", type(e).__name__)
    print([m.get("method") or m.get("id") for m in msgs])
    assert not [m for m in msgs if m.get("method") == "notifications/tasks"], msgs
    assert s.proc.wait(timeout=30) == 0
