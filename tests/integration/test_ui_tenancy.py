"""What a hostile review of the playground page, recent calls and evict_environment (issue
23) found: a task's call that lost its session is still its principal's (not "stdio"'s), the
page under --path / uses no protocol-relative URL (which would send the token elsewhere but
for the CSP), and the environment list tells a builder nothing of another tenant's use."""
import re
import time

from conftest import modern_call, wait_until
from test_http import HttpServer, make_http  # noqa: F401  (the fixture)
from test_tasks import TASKS_VERSION, http_rpc


def test_page_at_root_path_uses_no_protocol_relative_urls(make_http):
    # --path /: the page's base is "/", so index.html asks for "//ui/app.js" (a script from
    # a host named "ui") and app.js fetches "//runs/..." with the Authorization header (a
    # host named "runs").  Only the CSP's 'self' stops the token leaving; the page is broken.
    s = make_http("--path", "/")
    st, _, body = s.request("GET", "/", headers={"Accept": "text/html"})
    assert st == 200, body
    html = body.decode()
    urls = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert urls and not any(u.startswith("//") for u in urls), urls
    # The script puts what is under the endpoint (files, the editor) after the endpoint's
    # path: never after the bare base, which is "/" here.
    st, _, js = s.request("GET", "/ui/app.js")
    assert st == 200
    assert not re.search(r'BASE \+ "/', js.decode()), "app.js builds URLs from the bare base"
    # And the assets are where the page asks for them.
    for u in urls:
        st, _, _ = s.request("GET", u)
        assert st == 200, u


def test_orphaned_task_call_is_not_recorded_as_stdio(make_http, tmp_path):
    # A task's run whose session ended (DELETE) has no session: its call must still be
    # filed under its principal, never under "stdio" (which no token may be named).
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:tok-alice-0123456789\nbob:tok-bob-0123456789\n")
    h = make_http("--auth-token-file", str(tokens))
    alice = {"Authorization": "Bearer tok-alice-0123456789"}
    sid = h.initialize(TASKS_VERSION, headers=alice)
    r = http_rpc(h, sid, alice, 1, "tools/call",
                 {"name": "execute_python", "task": {"ttl": 60000},
                  "arguments": {"script": "import time; time.sleep(2); print('alice secret')",
                                "timeout_seconds": 60}})
    assert "task" in r["result"], r
    st, _, _ = h.request("DELETE", "/mcp", headers={"Mcp-Session-Id": sid, **alice})
    assert st == 200

    def recent(tok):
        return modern_call(h, tok, "check_environment", {})["structuredContent"]["recent_calls"]

    # The run ends in alice's list (filed under "stdio", as it was, it would never show:
    # a token may not be named so).
    assert wait_until(lambda: recent("tok-alice-0123456789"), 30)
    time.sleep(0.5)
    assert recent("tok-bob-0123456789") == []  # never another principal's
    assert [c["tool"] for c in recent("tok-alice-0123456789")] == ["execute_python"]


def test_modern_task_call_is_recorded_for_its_principal(make_http, tmp_path):
    # The stateless revision: a call the tasks extension makes a task runs on after its POST's
    # per-request session is freed: it is still its principal's.
    from test_tasks_attacks import modern_post
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:tok-alice-0123456789\nbob:tok-bob-0123456789\n")
    h = make_http("--auth-token-file", str(tokens))
    alice = {"Authorization": "Bearer tok-alice-0123456789"}
    r = modern_post(h, 1, "tools/call",
                    {"name": "execute_python",
                     "arguments": {"script": "import time; time.sleep(1)", "timeout_seconds": 120}},
                    alice, declare=True)
    assert r["result"]["resultType"] == "task", r

    def recent(tok):
        return modern_call(h, tok, "check_environment", {})["structuredContent"]["recent_calls"]

    assert wait_until(lambda: recent("tok-alice-0123456789"), 30)
    time.sleep(0.5)
    assert recent("tok-bob-0123456789") == []
    assert [c["tool"] for c in recent("tok-alice-0123456789")] == ["execute_python"]


# ------------------------------------------------------------------ environments across tenants

from test_deps import wheels  # noqa: E402,F401  (the fixture: a local wheelhouse)
from test_tenancy import ALICE, BOB, execute, make_tenants, rpc, tokens  # noqa: E402,F401


def _items(s, sid, auth, req_id):
    st, msg = rpc(s, sid, auth, req_id, "tools/call", {"name": "check_environment", "arguments": {}})
    assert st == 200 and "result" in msg, msg
    return msg["result"]["structuredContent"]["tenant"]["environments"]["items"]


def test_the_environment_list_does_not_tell_another_tenants_use(make_tenants, wheels):
    # Environments are shared by requirement set, and charged to their builder; a time of
    # last use (the manifest's mtime, which any principal's use touches) would tell Alice,
    # who built the environment of a requirement set, whether and when another tenant runs
    # with the same set.  Her list says when it was built, and nothing that Bob's use changes.
    s = make_tenants("--find-links", wheels, "--offline")
    alice, bob = s.initialize(headers=ALICE), s.initialize(headers=BOB)
    a = execute(s, alice, ALICE, 1, "pass", dependencies=["mps-gamma"])["structuredContent"]["environment"]["key"]
    before = {i["key"]: i for i in _items(s, alice, ALICE, 2)}[a]
    assert "last_used" not in before and isinstance(before["built"], int), before
    time.sleep(2.1)
    r = execute(s, bob, BOB, 3, "pass", dependencies=["mps-gamma"])["structuredContent"]["environment"]
    assert r["key"] == a and r["cached"] is True  # bob runs in alice's environment
    after = {i["key"]: i for i in _items(s, alice, ALICE, 4)}[a]
    assert after == before, "alice sees bob's use of the environment she built"
