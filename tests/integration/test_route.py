"""--route NAME (issue 33): a replica of a fleet says in every id it hands out that it made
it (task, Python session, run), and an id another replica made is answered as that
replica's, never as unknown."""
import re
import subprocess

from conftest import BINARY

ZEROS = "0" * 32


def uri_of(res):
    for c in res["content"]:
        uri = c.get("uri") or (c.get("resource") or {}).get("uri")
        if uri and uri.startswith("sandbox://runs/"):
            return uri
    raise AssertionError(res["content"])


def test_ids_carry_the_route_and_a_foreign_id_says_whose_it_is(make_server):
    s = make_server("--route", "r1", "--prestart", "off")
    s.initialize("2025-11-25")
    # A run's output file, a Python session, a task: each id starts with "r1.".
    res = s.execute("import os\nos.makedirs('outputs', exist_ok=True)\n"
                    "open('outputs/x.txt', 'w').write('hello')\n")
    uri = uri_of(res)
    assert re.fullmatch(r"sandbox://runs/r1\.[0-9a-f]{32}/outputs/x\.txt", uri), uri
    assert s.request("resources/read", {"uri": uri})["result"]["contents"][0]["text"] == "hello"
    listed = s.request("resources/list")["result"]["resources"]
    assert [r["uri"] for r in listed] == [uri]
    ses = s.execute("n = 1", session="new")
    sid = ses["structuredContent"]["session"]["id"]
    assert re.fullmatch(r"r1\.s-[0-9a-f]{20}", sid), sid
    assert s.execute("print(n + 1)", session=sid)["structuredContent"]["stdout"] == "2\n"
    task = s.request("tools/call", {"name": "execute_python", "arguments": {"details": True, "script": "print(3)"},
                                    "task": {"ttl": 60000}})["result"]["task"]
    assert re.fullmatch(r"r1\.[0-9a-f]{32}", task["taskId"]), task

    # Another replica's ids: whose they are, with the request's id.
    e = s.request("tasks/get", {"taskId": f"r2.{ZEROS}"}, req_id="t-r2")
    assert e["id"] == "t-r2" and e["error"]["code"] == -32602
    assert "belongs to replica r2, and this is replica r1" in e["error"]["message"], e
    assert "unknown" not in e["error"]["message"]
    e = s.request("resources/read", {"uri": f"sandbox://runs/r2.{ZEROS}/outputs/x.txt"})["error"]
    assert "belongs to replica r2" in e["message"] and e["data"]["uri"].startswith("sandbox://runs/r2."), e
    res = s.execute("print(n)", session="r2.s-" + "0" * 20)
    assert res["isError"] and "belongs to replica r2" in res["content"][0]["text"], res
    assert "unknown" not in res["content"][0]["text"]
    # Its own route, an id it no longer has: that it does not exist (here) any more.
    e = s.request("tasks/get", {"taskId": f"r1.{ZEROS}"})["error"]
    assert "no task of yours has that id in replica r1" in e["message"], e
    e = s.request("resources/read", {"uri": f"sandbox://runs/r1.{ZEROS}/outputs/x.txt"})["error"]
    assert "no run of yours has that id in replica r1" in e["message"], e
    # A background run's id too: wait_run and cancel_run of another replica's run say whose it is.
    for tool in ("wait_run", "cancel_run"):
        res = s.call(tool, {"run_id": f"r2.{ZEROS}"})
        assert res["isError"] and "belongs to replica r2, and this is replica r1" in res["content"][0]["text"], res
    # (An id without a route, from a server without --route, is this server's kind of unknown.)
    res = s.execute("print(n)", session="s-" + "0" * 20)
    assert "session expired or unknown" in res["content"][0]["text"]


def test_a_route_is_a_short_lowercase_name(tmp_path):
    for bad in ["R1", "", "a.b", "x" * 17, "é"]:
        p = subprocess.run([BINARY, "--route", bad, "--state-dir", str(tmp_path), "--sandbox-backend", "none"],
                           input=b"", capture_output=True, timeout=20)
        assert p.returncode != 0 and b"--route" in p.stderr, (bad, p.stderr)
