"""A minimal MCP client for tests/package/test-deb.sh: runs the installed server (the command
after --) and checks one execute_python call and check_environment over stdio or HTTP.

    mcp_check.py stdio -- COMMAND...
    mcp_check.py http --port N -- COMMAND...     (bearer token in $MPS_CHECK_TOKEN)
"""
import http.client
import json
import os
import subprocess
import sys
import time

SCRIPT = "import os\nprint('answer', 6 * 7, 'uid', os.getuid())\n"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "package-check", "version": "0"}}}


def call(i, name, args):
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": args}}


def check_results(run, env):
    text = run["result"]["content"][0]["text"]
    assert "answer 42" in text, text
    uid = int(text.split("uid", 1)[1].split()[0])
    assert uid != 0, f"the run kept root: {text}"
    sc = env["result"]["structuredContent"]
    assert sc["sandbox_backend"] == "bwrap" and sc["sandbox_available"], sc
    files = sc["server_files"]
    assert files["drop_helper"] == "/usr/libexec/mcp-python-exec-sandbox/mps-sandbox-drop", files
    assert files["runner"] == "/usr/share/mcp-python-exec-sandbox/runner/runner.py", files
    print(f"  run: {' '.join(text.split())}; check_environment: {files}")


def stdio(cmd):
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr)
    def send(m):
        p.stdin.write((json.dumps(m) + "\n").encode())
        p.stdin.flush()
    def answer(i):
        for line in p.stdout:
            m = json.loads(line)
            if m.get("id") == i:
                return m
        raise AssertionError(f"no answer to {i}")
    send(INIT)
    assert answer(1)["result"]["serverInfo"]["name"] == "mcp-python-exec-sandbox"
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send(call(2, "execute_python", {"script": SCRIPT}))
    run = answer(2)
    send(call(3, "check_environment", {}))
    env = answer(3)
    check_results(run, env)
    p.stdin.close()
    assert p.wait(timeout=30) == 0, p.returncode


def http_mode(port, cmd):
    token = os.environ["MPS_CHECK_TOKEN"]
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=subprocess.PIPE)
    try:
        seen = []
        for raw in p.stderr:
            seen.append(raw.decode())
            if "listening on" in seen[-1]:
                break
        else:
            raise AssertionError("the server did not listen: " + "".join(seen))
        def post(msg, sid=None, auth=True):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                 "MCP-Protocol-Version": "2025-06-18"}
            if auth:
                h["Authorization"] = "Bearer " + token
            if sid:
                h["Mcp-Session-Id"] = sid
            c.request("POST", "/mcp", json.dumps(msg), h)
            r = c.getresponse()
            body = r.read().decode()
            if r.getheader("Content-Type", "").startswith("text/event-stream"):
                msgs = [json.loads(l[5:]) for l in body.splitlines() if l.startswith("data:") and l[5:].strip()]
                body = json.dumps([m for m in msgs if "id" in m][-1])
            return r.status, r.getheader("Mcp-Session-Id"), body
        st, _, _ = post(INIT, auth=False)
        assert st == 401, f"no token: {st}"
        st, sid, body = post(INIT)
        assert st == 200 and sid, (st, body)
        post({"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
        st, _, run = post(call(2, "execute_python", {"script": SCRIPT}), sid)
        assert st == 200, (st, run)
        st, _, env = post(call(3, "check_environment", {}), sid)
        check_results(json.loads(run), json.loads(env))
    finally:
        p.terminate()
        rc = p.wait(timeout=30)
        rest = p.stderr.read().decode()
        if rc != 0:
            sys.stderr.write(rest)
        assert rc == 0, f"exit {rc}"


def main():
    mode = sys.argv[1]
    dash = sys.argv.index("--")
    cmd = sys.argv[dash + 1:]
    if mode == "stdio":
        stdio(cmd)
    else:
        port = int(sys.argv[sys.argv.index("--port") + 1])
        http_mode(port, cmd)


if __name__ == "__main__":
    main()
