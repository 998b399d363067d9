"""Tasks (2025-11-25 utilities/tasks): a task-augmented execute_python is answered at once
with a CreateTaskResult while its run goes on; tasks/get, tasks/result, tasks/list and
tasks/cancel reach it, only for its own principal; the store's TTL and per-principal cap
bound it.  Over stdio and Streamable HTTP (two bearer tokens)."""
import json
import re
import signal
import time

import pytest

from conftest import Server, descendants, processes_with_marker, wait_until
from test_http import LATEST, HttpServer, messages, sse_events_from_bytes

TASKS_VERSION = "2025-11-25"
RELATED = "io.modelcontextprotocol/related-task"
TERMINAL = ("completed", "failed", "cancelled")


def ticks(n):
    return "".join(f"tick {i}\n" for i in range(n))


def tick_script(n, pause=0.3):
    return f"import time\nfor i in range({n}):\n    print(f'tick {{i}}', flush=True)\n    time.sleep({pause})"


def sleeper(marker):
    # The marker is in a child's argv: processes_with_marker finds the tree.
    return ("import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'])\n"
            "print('started', flush=True)\ntime.sleep(120)")


def task_call(s, script, ttl=60000, token=None, req_id=None, **args):
    params = {"name": "execute_python", "arguments": {"script": script, "timeout_seconds": 120, **args},
              "task": {"ttl": ttl}}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return s.request("tools/call", params, req_id=req_id)


def check_task(task, status="working"):
    assert re.fullmatch(r"[0-9a-f]{32}", task["taskId"]), task
    assert task["status"] == status
    for k in ("createdAt", "lastUpdatedAt"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", task[k]), task
    assert isinstance(task["ttl"], int) and task["pollInterval"] > 0


def poll(get, task_id, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        task = get(task_id)
        if task["status"] in TERMINAL:
            return task
        assert time.monotonic() < deadline, task
        time.sleep(0.2)


@pytest.fixture
def tasks_server(make_server):
    def make(*args):
        s = make_server("--kill-grace-seconds", "1", *args)
        s.initialize(TASKS_VERSION)
        return s
    return make


def stdio_get(s):
    def get(task_id):
        r = s.request("tasks/get", {"taskId": task_id})
        assert "result" in r, r
        return r["result"]
    return get


# ================================================================ stdio

def test_declares_tasks_for_execute_python_only(tasks_server, make_server):
    s = tasks_server()
    caps = s.request("initialize", {"protocolVersion": TASKS_VERSION, "capabilities": {}})
    assert "error" in caps  # already initialized; the capabilities come from the fixture's
    tools = {t["name"]: t for t in s.request("tools/list")["result"]["tools"]}
    assert tools["execute_python"]["execution"] == {"taskSupport": "optional"}
    assert "execution" not in tools["check_environment"]
    # A tool that does not run as a task: -32601 (2025-11-25, tools/call).
    r = s.request("tools/call", {"name": "check_environment", "arguments": {}, "task": {"ttl": 1000}})
    assert r["error"]["code"] == -32601
    # Older versions were offered no tasks.
    old = make_server()
    assert "tasks" not in old.initialize("2025-06-18")["capabilities"]
    # ... and get none: params.task is ignored (a plain answer), tasks/ methods do not exist.
    r = old.request("tools/call", {"name": "execute_python", "arguments": {"script": "print(7)"},
                                   "task": {"ttl": 60000}})
    assert "task" not in r["result"] and "7" in r["result"]["content"][0]["text"], r
    assert old.request("tasks/list")["error"]["code"] == -32601
    assert old.request("tasks/get", {"taskId": "0" * 32})["error"]["code"] == -32601
    fresh = make_server()
    caps = fresh.initialize(TASKS_VERSION)["capabilities"]
    assert caps["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


def test_task_polled_to_completion_with_progress(tasks_server):
    s = tasks_server()
    r = task_call(s, tick_script(6), token="tp")
    task = r["result"]["task"]
    check_task(task)
    assert task["ttl"] == 60000
    # tasks/result waits until the run is over, then answers with exactly its result.
    s.send({"jsonrpc": "2.0", "id": "wait", "method": "tasks/result", "params": {"taskId": task["taskId"]}})
    res = s.recv_response("wait", timeout=60)["result"]
    assert res["structuredContent"]["stdout"] == ticks(6)
    assert res["isError"] is False
    assert res["_meta"][RELATED] == {"taskId": task["taskId"]}
    # Progress flowed under the call's own token meanwhile, and the status was announced.
    progress = [n["params"] for n in s.notifications if n["method"] == "notifications/progress"]
    assert progress and all(p["progressToken"] == "tp" for p in progress)
    assert "tick 3" in "".join(p.get("message", "") for p in progress)
    statuses = [n["params"] for n in s.notifications if n["method"] == "notifications/tasks/status"]
    assert statuses and statuses[-1]["taskId"] == task["taskId"] and statuses[-1]["status"] == "completed"
    done = stdio_get(s)(task["taskId"])
    check_task(done, "completed")
    assert done["createdAt"] == task["createdAt"]
    # Read again: the same result (kept until the TTL).
    again = s.request("tasks/result", {"taskId": task["taskId"]})["result"]
    assert again == res
    listed = s.request("tasks/list")["result"]["tasks"]
    assert [t["taskId"] for t in listed] == [task["taskId"]]


def test_bad_task_params(tasks_server):
    s = tasks_server()
    for bad in ({"ttl": "soon"}, {"ttl": -1}, 5):
        r = s.request("tools/call", {"name": "execute_python", "arguments": {"script": "1"}, "task": bad})
        assert r["error"]["code"] == -32602, r
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        assert s.request(method, {})["error"]["code"] == -32602
        assert s.request(method, {"taskId": "0" * 32})["error"]["code"] == -32602
    assert s.request("tasks/list", {"cursor": "nope"})["error"]["code"] == -32602


def test_ttl_is_capped(tasks_server):
    s = tasks_server("--max-task-ttl", "5")
    task = task_call(s, "print(1)", ttl=10 ** 9)["result"]["task"]
    assert task["ttl"] == 5000
    task = s.request("tools/call", {"name": "execute_python", "arguments": {"script": "print(1)"},
                                    "task": {}})["result"]["task"]
    assert task["ttl"] == 5000


def test_cancel_kills_the_process_tree(tasks_server):
    s = tasks_server()
    marker = f"mps-task-cancel-{time.monotonic_ns()}"
    task = task_call(s, sleeper(marker))["result"]["task"]
    assert wait_until(lambda: processes_with_marker(marker), 30), "the script never started"
    s.send({"jsonrpc": "2.0", "id": "wait", "method": "tasks/result", "params": {"taskId": task["taskId"]}})
    r = s.request("tasks/cancel", {"taskId": task["taskId"]})
    check_task(r["result"], "cancelled")
    assert wait_until(lambda: not processes_with_marker(marker), 15), "the script outlived tasks/cancel"
    assert wait_until(lambda: not descendants(s.proc.pid), 15), descendants(s.proc.pid)
    assert stdio_get(s)(task["taskId"])["status"] == "cancelled"
    # A terminal task cannot be cancelled again; its waiting tasks/result got an error.
    assert s.request("tasks/cancel", {"taskId": task["taskId"]})["error"]["code"] == -32602
    waited = [m for m in s.stray if m.get("id") == "wait"] or [s.recv_response("wait")]
    assert "cancelled" in waited[0]["error"]["message"]


def test_ttl_expiry(tasks_server):
    s = tasks_server()
    done = task_call(s, "print('quick')", ttl=1000)["result"]["task"]
    marker = f"mps-task-ttl-{time.monotonic_ns()}"
    running = task_call(s, sleeper(marker), ttl=5000)["result"]["task"]

    def gone(task):
        return s.request("tasks/get", {"taskId": task["taskId"]}).get("error", {}).get("code") == -32602

    # Gone after its TTL (one timer for the store), finished or not.
    assert wait_until(lambda: gone(done), 20)
    # A task still working when its TTL ends is cancelled: its script dies with it.
    assert wait_until(lambda: processes_with_marker(marker) or gone(running), 30)
    assert wait_until(lambda: gone(running), 20)
    assert wait_until(lambda: not processes_with_marker(marker), 20), "the script outlived its task"
    assert s.request("tasks/list")["result"]["tasks"] == []


def test_per_principal_cap(tasks_server):
    s = tasks_server("--max-tasks-per-principal", "2")
    ids = [task_call(s, "print(1)")["result"]["task"]["taskId"] for _ in range(2)]
    r = task_call(s, "print(1)")
    assert r["error"]["code"] == -32602 and "--max-tasks-per-principal" in r["error"]["message"]
    # A plain call is not a task: not refused.
    assert s.execute("print(2)")["structuredContent"]["stdout"] == "2\n"
    for i in ids:
        assert poll(stdio_get(s), i)["status"] == "completed"


def test_list_pages(tasks_server):
    s = tasks_server()
    ids = [task_call(s, "print(1)")["result"]["task"]["taskId"] for _ in range(3)]
    seen = [t["taskId"] for t in s.request("tasks/list")["result"]["tasks"]]
    assert seen == ids


def test_admission_caps_count_tasks(tasks_server):
    s = tasks_server("--max-token-concurrent", "1")
    marker = f"mps-task-adm-{time.monotonic_ns()}"
    first = task_call(s, sleeper(marker))["result"]["task"]
    assert wait_until(lambda: processes_with_marker(marker), 30)
    second = task_call(s, "print('x')")["result"]["task"]
    res = s.request("tasks/result", {"taskId": second["taskId"]}, timeout=30)["result"]
    assert res["isError"] is True and "--max-token-concurrent" in res["content"][0]["text"]
    s.request("tasks/cancel", {"taskId": first["taskId"]})
    assert wait_until(lambda: not processes_with_marker(marker), 15)


def test_end_of_input_ends_running_tasks(make_server):
    s = make_server("--kill-grace-seconds", "1")
    s.initialize(TASKS_VERSION)
    marker = f"mps-task-eof-{time.monotonic_ns()}"
    task_call(s, sleeper(marker))
    assert wait_until(lambda: processes_with_marker(marker), 30)
    assert s.close(timeout=20) == 0
    assert wait_until(lambda: not processes_with_marker(marker), 10)


# ================================================================ HTTP

def http_rpc(h, sid, auth, req_id, method, params=None):
    msg = {"jsonrpc": "2.0", "id": req_id, "method": method}
    if params is not None:
        msg["params"] = params
    st, hdrs, body = h.post(msg, sid, headers=auth, version=TASKS_VERSION)
    assert st == 200, (st, body[:500])
    if hdrs.get("content-type", "").startswith("text/event-stream"):
        return [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == req_id][0]
    return json.loads(body)


@pytest.fixture
def two_tokens(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("alice: tok-alice-0123456789\nbob: tok-bob-9876543210\n")
    return str(path)


ALICE = {"Authorization": "Bearer tok-alice-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-9876543210"}


def test_http_task_belongs_to_its_principal_and_outlives_its_session(make_http_tasks):
    h = make_http_tasks
    a1 = h.initialize(TASKS_VERSION, headers=ALICE)
    b = h.initialize(TASKS_VERSION, headers=BOB)
    marker = f"mps-task-http-{time.monotonic_ns()}"
    r = http_rpc(h, a1, ALICE, 1, "tools/call",
                 {"name": "execute_python", "task": {"ttl": 60000},
                  "arguments": {"script": sleeper(marker), "timeout_seconds": 120}})
    task = r["result"]["task"]
    check_task(task)
    tid = {"taskId": task["taskId"]}
    assert wait_until(lambda: processes_with_marker(marker), 30)
    # bob: exactly "not found", from every method, and nothing in his list.
    for i, method in enumerate(("tasks/get", "tasks/result", "tasks/cancel")):
        e = http_rpc(h, b, BOB, 10 + i, method, tid)
        assert e["error"]["code"] == -32602, e
    assert http_rpc(h, b, BOB, 20, "tasks/list")["result"]["tasks"] == []
    assert processes_with_marker(marker), "bob's attempts stopped alice's script"
    # alice's session ends; the task goes on, and another session of hers reaches it.
    st, _, _ = h.request("DELETE", "/mcp", headers={"Mcp-Session-Id": a1, **ALICE})
    assert st == 200
    a2 = h.initialize(TASKS_VERSION, headers=ALICE)
    got = http_rpc(h, a2, ALICE, 30, "tasks/get", tid)["result"]
    assert got["status"] == "working" and processes_with_marker(marker)
    assert [t["taskId"] for t in http_rpc(h, a2, ALICE, 31, "tasks/list")["result"]["tasks"]] == [task["taskId"]]
    assert http_rpc(h, a2, ALICE, 32, "tasks/cancel", tid)["result"]["status"] == "cancelled"
    assert wait_until(lambda: not processes_with_marker(marker), 15)


def test_http_result_after_reconnect(make_http_tasks):
    h = make_http_tasks
    a1 = h.initialize(TASKS_VERSION, headers=ALICE)
    r = http_rpc(h, a1, ALICE, 1, "tools/call",
                 {"name": "execute_python", "task": {"ttl": 60000},
                  "arguments": {"script": tick_script(5), "timeout_seconds": 60}})
    tid = {"taskId": r["result"]["task"]["taskId"]}
    # Nobody polls, nobody holds a stream; a new session (same token) gets the whole result once.
    a2 = h.initialize(TASKS_VERSION, headers=ALICE)
    res = http_rpc(h, a2, ALICE, 2, "tasks/result", tid)["result"]
    assert res["structuredContent"]["stdout"] == ticks(5)
    assert res["_meta"][RELATED] == tid


@pytest.fixture
def make_http_tasks(two_tokens):
    h = HttpServer("--auth-token-file", two_tokens, "--no-warm-cache", "--kill-grace-seconds", "1")
    yield h
    assert h.close() == 0


# ================================================================ 2026-07-28: the tasks extension

MODERN = "2026-07-28"
EXT = "io.modelcontextprotocol/tasks"


def modern_req(s, req_id, method, params=None, declare=True):
    caps = {"extensions": {EXT: {}}} if declare else {}
    p = dict(params or {})
    p["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                  "io.modelcontextprotocol/clientCapabilities": caps}
    s.send({"jsonrpc": "2.0", "id": req_id, "method": method, "params": p})
    return s.recv_response(req_id, timeout=60)


def test_modern_extension_long_calls_become_tasks(make_server):
    s = make_server("--kill-grace-seconds", "1")
    caps = modern_req(s, 1, "server/discover")["result"]["capabilities"]
    assert caps["extensions"][EXT] == {}
    assert "tasks" not in caps  # the 2025-11-25 capability is the handshake era's
    # A call allowed to run longer than a minute, from a client that declared the extension:
    marker = f"mps-task-modern-{time.monotonic_ns()}"
    r = modern_req(s, 2, "tools/call", {"name": "execute_python",
                                        "arguments": {"script": sleeper(marker), "timeout_seconds": 120}})
    created = r["result"]
    assert created["resultType"] == "task" and created["status"] == "working", created
    assert re.fullmatch(r"[0-9a-f]{32}", created["taskId"]) and created["ttlMs"] > 0 and created["pollIntervalMs"] > 0
    assert "task" not in created and "ttl" not in created  # flat, the extension's names
    tid = {"taskId": created["taskId"]}
    got = modern_req(s, 3, "tasks/get", tid)["result"]
    assert got["resultType"] == "complete" and got["status"] == "working"
    # Without the declaration: -32021 naming the extension; tasks/list and tasks/result are not part of it.
    e = modern_req(s, 4, "tasks/get", tid, declare=False)["error"]
    assert e["code"] == -32021 and e["data"]["requiredCapabilities"] == {"extensions": {EXT: {}}}
    assert modern_req(s, 5, "tasks/list")["error"]["code"] == -32601
    assert modern_req(s, 6, "tasks/result", tid)["error"]["code"] == -32601
    assert wait_until(lambda: processes_with_marker(marker), 30)
    ack = modern_req(s, 7, "tasks/cancel", tid)["result"]
    assert ack["resultType"] == "complete" and set(ack) <= {"resultType", "_meta"}
    assert wait_until(lambda: not processes_with_marker(marker), 15)
    assert modern_req(s, 8, "tasks/get", tid)["result"]["status"] == "cancelled"
    # A short call stays plain; so does a long one from a client without the extension.
    plain = modern_req(s, 9, "tools/call", {"name": "execute_python", "arguments": {"script": "print(3)"}})["result"]
    assert plain["resultType"] == "complete" and plain["structuredContent"]["stdout"] == "3\n"
    plain = modern_req(s, 10, "tools/call", {"name": "execute_python",
                                             "arguments": {"script": "print(4)", "timeout_seconds": 120}},
                       declare=False)["result"]
    assert plain["resultType"] == "complete" and plain["structuredContent"]["stdout"] == "4\n"
    # A task's result comes inline with tasks/get once it is done.
    done = modern_req(s, 11, "tools/call", {"name": "execute_python",
                                            "arguments": {"script": "print(5)", "timeout_seconds": 90}})["result"]
    assert done["resultType"] == "task"

    def status():
        return modern_req(s, 12, "tasks/get", {"taskId": done["taskId"]})["result"]
    assert wait_until(lambda: status()["status"] == "completed", 30)
    assert status()["result"]["structuredContent"]["stdout"] == "5\n"


def test_modern_http_task_outlives_its_post(make_http_tasks):
    h = make_http_tasks

    def post(req_id, method, params, auth=ALICE):
        p = dict(params)
        p["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                      "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}}}
        extra = {"Mcp-Method": method}
        if "name" in p:
            extra["Mcp-Name"] = p["name"]
        if "taskId" in p:
            extra["Mcp-Name"] = p["taskId"]
        st, hd, body = h.post({"jsonrpc": "2.0", "id": req_id, "method": method, "params": p},
                              headers={**auth, **extra}, version=MODERN)
        if hd.get("content-type", "").startswith("text/event-stream"):
            return [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == req_id][0]
        return json.loads(body)
    r = post(1, "tools/call", {"name": "execute_python",
                               "arguments": {"script": tick_script(3), "timeout_seconds": 120}})
    tid = {"taskId": r["result"]["taskId"]}
    assert r["result"]["resultType"] == "task"
    # The POST is over; the run goes on, and only its principal reaches it.
    assert post(2, "tasks/get", tid, auth=BOB)["error"]["code"] == -32602
    deadline = time.monotonic() + 60
    while (got := post(3, "tasks/get", tid)["result"])["status"] == "working":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert got["status"] == "completed" and got["result"]["structuredContent"]["stdout"] == ticks(3)


def test_kept_results_are_bounded_per_principal(tasks_server):
    """Results of finished tasks are held until their TTL: their bytes are bounded, the
    principal's own oldest go first, and one result over the bound is not kept at all."""
    s = tasks_server("--max-task-result-bytes-per-principal", "50K")
    get = stdio_get(s)
    ids = []
    for i in range(3):
        # about 23.3 KB of result: the output in structuredContent, its beginning and end (15%)
        # in the text block (past 16 KiB of output, the output is in the result once)
        r = task_call(s, f"print('{i}' * 20000)")
        ids.append(r["result"]["task"]["taskId"])
        assert poll(get, ids[-1])["status"] == "completed"
    # Three results of about 23.3 KB in 50 KB: the oldest went, the two newest are there.
    first = s.request("tasks/get", {"taskId": ids[0]})
    assert first["error"]["code"] == -32602, first
    for t in ids[1:]:
        r = s.request("tasks/result", {"taskId": t})
        assert "result" in r and r["result"]["isError"] is False, r
    # One result larger than the bound: the task fails, saying why, and keeps nothing big.
    r = task_call(s, "print('x' * 60000)")
    big = r["result"]["task"]["taskId"]
    task = poll(get, big)
    assert task["status"] == "failed" and "--max-task-result-bytes-per-principal" in task["statusMessage"], task
    r = s.request("tasks/result", {"taskId": big})
    assert "error" in r and "larger than" in r["error"]["message"], r


# ================================================================ 2026-07-28: tasks on subscriptions/listen

SUB = "io.modelcontextprotocol/subscriptionId"


def modern_params(params, declare=True):
    p = dict(params)
    p["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                  "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}} if declare else {}}
    return p


def next_task_note(s, sub, timeout=60):
    """The next notifications/tasks of stream sub on stdio (others are kept aside)."""
    deadline = time.monotonic() + timeout
    while True:
        m = s.recv(timeout=max(0.1, deadline - time.monotonic()))
        if m.get("method") == "notifications/tasks" and m["params"]["_meta"][SUB] == sub:
            return m["params"]
        s.stray.append(m)


def test_modern_listen_watches_the_principals_tasks(make_server):
    """taskIds on subscriptions/listen (the tasks extension): only for a client that declares
    it; the ack names the tasks that are the caller's; their state now, then every change, as
    the DetailedTask that tasks/get answers, tagged with the subscription."""
    s = make_server("--kill-grace-seconds", "1")
    # Without the extension: -32021 naming it.
    e = modern_req(s, 1, "subscriptions/listen", {"notifications": {"taskIds": ["0" * 32]}}, declare=False)["error"]
    assert e["code"] == -32021 and e["data"]["requiredCapabilities"] == {"extensions": {EXT: {}}}, e
    for i, bad in enumerate(["x", [1], ["a"] * 65, ["x" * 129], [""]]):
        r = modern_req(s, f"bad{i}", "subscriptions/listen", {"notifications": {"taskIds": bad}})
        assert r["error"]["code"] == -32602 and "taskIds" in r["error"]["message"], (bad, r)
    # A task that runs a while and then prints.
    created = modern_req(s, 2, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\ntime.sleep(1.5)\nprint('done')", "timeout_seconds": 120}})["result"]
    assert created["resultType"] == "task", created
    tid = created["taskId"]
    unknown = "0" * 32
    s.send({"jsonrpc": "2.0", "id": "L", "method": "subscriptions/listen",
            "params": modern_params({"notifications": {"taskIds": [tid, unknown, tid]}})})
    ack = s.recv(timeout=30)
    assert ack["method"] == "notifications/subscriptions/acknowledged", ack
    assert ack["params"]["notifications"] == {"taskIds": [tid]}, ack
    now = next_task_note(s, "L")
    assert now["taskId"] == tid and now["status"] == "working" and now["ttlMs"] > 0, now
    done = next_task_note(s, "L")
    assert done["taskId"] == tid and done["status"] == "completed", done
    assert done["result"]["structuredContent"]["stdout"] == "done\n", done
    got = modern_req(s, 3, "tasks/get", {"taskId": tid})["result"]
    assert {k: v for k, v in got.items() if k not in ("_meta", "resultType")} == \
        {k: v for k, v in done.items() if k != "_meta"}
    # A stream opened on a finished task hears its final state at once.
    s.send({"jsonrpc": "2.0", "id": "L2", "method": "subscriptions/listen",
            "params": modern_params({"notifications": {"taskIds": [tid]}})})
    assert s.recv(timeout=30)["params"]["notifications"] == {"taskIds": [tid]}
    assert next_task_note(s, "L2")["status"] == "completed"
    # A cancelled task: the stream hears "cancelled" (and the first one too).
    marker = f"mps-task-listen-{time.monotonic_ns()}"
    t2 = modern_req(s, 4, "tools/call", {"name": "execute_python", "arguments": {
        "script": sleeper(marker), "timeout_seconds": 120}})["result"]["taskId"]
    s.send({"jsonrpc": "2.0", "id": "L3", "method": "subscriptions/listen",
            "params": modern_params({"notifications": {"taskIds": [t2]}})})
    assert s.recv(timeout=30)["params"]["notifications"] == {"taskIds": [t2]}
    assert next_task_note(s, "L3")["status"] == "working"
    assert wait_until(lambda: processes_with_marker(marker), 30)
    s.send({"jsonrpc": "2.0", "id": 5, "method": "tasks/cancel", "params": modern_params({"taskId": t2})})
    assert next_task_note(s, "L3")["status"] == "cancelled"
    assert wait_until(lambda: not processes_with_marker(marker), 15)


def test_modern_http_listen_hears_only_its_principals_tasks(make_http_tasks):
    """Bob names alice's task on his stream: it is not agreed (as an unknown id) and he hears
    nothing of it, while alice's stream hears it end."""
    h = make_http_tasks

    def post(req_id, method, params, auth):
        p = modern_params(params)
        extra = {"Mcp-Method": method, "Mcp-Name": p.get("name") or p.get("taskId") or ""}
        if not extra["Mcp-Name"]:
            del extra["Mcp-Name"]
        st, hd, body = h.post({"jsonrpc": "2.0", "id": req_id, "method": method, "params": p},
                              headers={**auth, **extra}, version=MODERN)
        assert st == 200, body
        if hd.get("content-type", "").startswith("text/event-stream"):
            return [m for m in messages(sse_events_from_bytes(body)) if m.get("id") == req_id][0]
        return json.loads(body)

    def listen(req_id, auth, task_ids):
        msg = {"jsonrpc": "2.0", "id": req_id, "method": "subscriptions/listen",
               "params": modern_params({"notifications": {"taskIds": task_ids}})}
        c = h.connect()
        c.request("POST", "/mcp", json.dumps(msg).encode(),
                  {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
                   "MCP-Protocol-Version": MODERN, "Mcp-Method": "subscriptions/listen", **auth})
        r = c.getresponse()
        assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream", r.read()[:500]
        return c, r

    def next_message(r):
        data = []
        while True:
            line = r.fp.readline()
            assert line, "the stream ended"
            line = line.decode().rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and data and data != [""]:
                return json.loads("\n".join(data))
            elif line == "":
                data = []

    created = post(1, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\ntime.sleep(2)\nprint('alice')", "timeout_seconds": 120}}, ALICE)["result"]
    assert created["resultType"] == "task", created
    tid = created["taskId"]
    cb, rb = listen("lb", BOB, [tid])
    ack = next_message(rb)
    assert ack["params"]["notifications"] == {"taskIds": []}, ack
    ca, ra = listen("la", ALICE, [tid])
    assert next_message(ra)["params"]["notifications"] == {"taskIds": [tid]}
    assert next_message(ra)["params"]["status"] == "working"
    end = next_message(ra)
    assert end["method"] == "notifications/tasks" and end["params"]["status"] == "completed", end
    assert end["params"]["result"]["structuredContent"]["stdout"] == "alice\n"
    # Bob's stream: nothing came (a short read finds no event).
    cb.sock.settimeout(1.0)
    try:
        line = rb.fp.readline()
        assert not line.startswith(b"data:") or b"notifications/tasks" not in line, line
    except (TimeoutError, OSError):
        pass
    ca.close()
    cb.close()


def _listen_tasks(s, sub, task_ids):
    """Opens stream sub on stdio watching task_ids; its acknowledgement's notifications (what
    came before it is kept aside, in s.stray)."""
    s.send({"jsonrpc": "2.0", "id": sub, "method": "subscriptions/listen",
            "params": modern_params({"notifications": {"taskIds": task_ids}})})
    while True:
        m = s.recv(timeout=30)
        if m.get("method") == "notifications/subscriptions/acknowledged" and m["params"]["_meta"][SUB] == sub:
            return m["params"]["notifications"]
        s.stray.append(m)


def test_modern_listen_eight_streams_naming_a_task_64_times_hear_each_change_once(make_server):
    """The principal's 8 streams (--max-listens-local 8) each name one task 64 times: each
    agrees to it once, and hears its state at once and its end, once each; a ninth stream ends
    the oldest idle one (L0) with its result and hears the task in its place."""
    s = make_server("--kill-grace-seconds", "1", "--max-listens-local", "8")
    tid = modern_req(s, 1, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\ntime.sleep(2)\nprint('x' * 50000)", "timeout_seconds": 120}})["result"]["taskId"]
    heard = {}

    def note(m):
        if m.get("method") == "notifications/tasks":
            assert m["params"]["taskId"] == tid, m
            heard.setdefault(m["params"]["_meta"][SUB], []).append(m["params"]["status"])
            return True
        return False
    for i in range(8):
        assert _listen_tasks(s, f"L{i}", [tid] * 64) == {"taskIds": [tid]}
    s.send({"jsonrpc": "2.0", "id": "L8", "method": "subscriptions/listen",
            "params": modern_params({"notifications": {"taskIds": [tid]}})})
    ended = None
    for m in s.stray:
        note(m)
    s.stray.clear()
    deadline = time.monotonic() + 60
    while sum(len(v) for v in heard.values()) < 17 or ended is None:
        m = s.recv(timeout=max(0.1, deadline - time.monotonic()))
        if m.get("id") == "L0":
            ended = m
        elif not note(m) and m.get("method") != "notifications/subscriptions/acknowledged":
            s.stray.append(m)
    assert "result" in ended, ended
    assert heard == {"L0": ["working"], **{f"L{i}": ["working", "completed"] for i in range(1, 9)}}, heard
    assert modern_req(s, 2, "tasks/get", {"taskId": tid})["result"]["status"] == "completed"
    assert not [m for m in s.stray if m.get("method") == "notifications/tasks"], s.stray


def test_modern_listen_hears_a_watched_task_expire(make_server):
    """A watched task still working at its TTL is cancelled: the stream hears that; the task is
    gone after, and a new stream does not agree to its id."""
    s = make_server("--kill-grace-seconds", "1", "--max-task-ttl", "3")
    marker = f"mps-task-listen-ttl-{time.monotonic_ns()}"
    tid = modern_req(s, 1, "tools/call", {"name": "execute_python", "arguments": {
        "script": sleeper(marker), "timeout_seconds": 120}})["result"]["taskId"]
    assert _listen_tasks(s, "L", [tid]) == {"taskIds": [tid]}
    assert next_task_note(s, "L")["status"] == "working"
    end = next_task_note(s, "L", timeout=60)
    assert end["status"] == "cancelled" and "TTL" in end["statusMessage"], end
    assert wait_until(lambda: not processes_with_marker(marker), 15)
    assert _listen_tasks(s, "L2", [tid]) == {"taskIds": []}
    assert "error" in modern_req(s, 2, "tasks/get", {"taskId": tid})


def test_modern_listen_drain_ends_a_stream_that_watches_a_running_task(make_server):
    """SIGTERM with a drain: the stream ends with its result at once, the watched task runs to
    its end, nothing more is said on the stream, and the server exits 0."""
    s = make_server("--kill-grace-seconds", "1", "--drain-seconds", "20")
    tid = modern_req(s, 1, "tools/call", {"name": "execute_python", "arguments": {
        "script": "import time\ntime.sleep(3)\nprint('ok')", "timeout_seconds": 120}})["result"]["taskId"]
    assert _listen_tasks(s, "L", [tid]) == {"taskIds": [tid]}
    assert next_task_note(s, "L")["status"] == "working"
    s.proc.send_signal(signal.SIGTERM)
    end = s.recv_response("L", timeout=30)
    assert end["result"]["_meta"][SUB] == "L", end
    after = []
    try:
        while True:
            after.append(s.recv(timeout=30))
    except EOFError:
        pass
    assert not [m for m in after if m.get("method") == "notifications/tasks"], after
    assert s.proc.wait(timeout=30) == 0
