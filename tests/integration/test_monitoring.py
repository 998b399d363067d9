"""The operator's monitoring material in deploy/: the Prometheus rules pass `promtool check
rules` and their own unit tests (`promtool test rules`: each alert fires on the series that
should fire it), and every metric name the rules and the Grafana dashboard (valid JSON) use is
one the server's /metrics really exports (or a recording rule of the rules file).
test_prometheus.py loads the same rules into a real Prometheus."""
import json
import os
import re
import shutil
import subprocess
import urllib.request

from test_http import HttpServer

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
RULES = os.path.join(ROOT, "deploy", "prometheus", "mcp-python-exec-sandbox.rules.yml")
RULES_TESTS = os.path.join(ROOT, "deploy", "prometheus", "mcp-python-exec-sandbox.rules.test.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "mcp-python-exec-sandbox.json")
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

NAME = re.compile(r"\b(mcp_sandbox[a-z0-9_:]*)")


def exported_names():
    """The series names /metrics shows (a histogram's _bucket, _sum and _count too)."""
    srv = HttpServer("--prestart", "off")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        srv.close()
    names = set()
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)$", line)
        if m:
            names.add(m.group(1))
            if m.group(2) == "histogram":
                names.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))
    return names


def recorded_names():
    with open(RULES) as f:
        return set(re.findall(r"^\s*- record: (\S+)$", f.read(), re.M))


def test_promtool_checks_the_rules_and_their_unit_tests():
    assert os.access(PROMTOOL, os.X_OK), "promtool is not installed (Debian's prometheus package has it)"
    check = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout
    unit = subprocess.run([PROMTOOL, "test", "rules", os.path.basename(RULES_TESTS)],
                          cwd=os.path.dirname(RULES_TESTS), capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_the_alerts_the_operator_needs_are_there():
    with open(RULES) as f:
        alerts = set(re.findall(r"^\s*- alert: (\S+)$", f.read(), re.M))
    for want in ("McpSandboxNotReady", "McpSandboxDrainStuck", "McpSandboxBuildFailures",
                 "McpSandboxLimitKills", "McpSandboxAuditLinesDropped", "McpSandboxWarmUpFailed"):
        assert want in alerts, alerts


def test_rules_and_dashboard_use_only_real_metric_names():
    exported = exported_names()
    recorded = recorded_names()
    assert "mcp_sandbox_warmup_failures_total" in exported and "mcp_sandbox_draining" in exported
    with open(RULES) as f:
        rules_text = f.read()
    with open(DASHBOARD) as f:
        dash = json.load(f)  # valid JSON, or this fails
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    assert len(exprs) >= 10, exprs
    used_in_rules = set(NAME.findall(rules_text))
    used_in_dash = set(n for e in exprs for n in NAME.findall(e))
    unknown = {n for n in used_in_rules | used_in_dash if n not in exported and n not in recorded}
    assert not unknown, f"names /metrics does not export: {sorted(unknown)}"
    # Every recording rule is used somewhere (the dashboard or an alert), and the dashboard's
    # panels each have a query.
    unused = {r for r in recorded if r not in used_in_dash and rules_text.count(r) < 2}
    assert not unused, unused
    assert all(p.get("targets") for p in dash["panels"])
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
