"""/metrics scraped by a real Prometheus (Debian's package), started by the test on loopback
with a bearer token: a query through its HTTP API sees the counters move after a few calls.
It loads deploy/prometheus's rules as an operator would: every rule evaluates without error,
the recording rules have values, and no alert fires on a healthy server."""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from conftest import BACKEND, wait_until
from test_http import HttpServer, call_msg

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
RULES = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "prometheus",
                     "mcp-python-exec-sandbox.rules.yml")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def value(port, expr):
    try:
        res = query(port, expr)
    except OSError:
        return None
    return float(res[0]["value"][1]) if res else None


def test_prometheus_scrapes_the_counters(tmp_path):
    assert os.access(PROMETHEUS, os.X_OK), "prometheus is not installed (deploy/install-deps.sh installs it)"
    tokens = tmp_path / "tokens"
    secret = "prom-scrape-token-0123456789"
    tokens.write_text(f"metrics:{secret}\n")
    srv = HttpServer("--sandbox-backend", BACKEND, "--auth-token-file", str(tokens), "--metrics-token",
                     "metrics", "--prestart", "off")
    prom_port = free_port()
    (tmp_path / "token").write_text(secret)
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {os.path.abspath(RULES)}
scrape_configs:
  - job_name: mcp
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials_file: {tmp_path / 'token'}
    static_configs:
      - targets: ['127.0.0.1:{srv.port}']
""")
    log = open(tmp_path / "prometheus.log", "wb")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        auth = {"Authorization": "Bearer " + secret}
        assert wait_until(lambda: value(prom_port, 'up{job="mcp"}') == 1, timeout=60), \
            (tmp_path / "prometheus.log").read_text()[-2000:]
        sid = srv.initialize(headers=auth)
        for i in range(3):
            st, _, _ = srv.post(call_msg(i + 1, f"print({i})"), sid, headers=auth)
            assert st == 200
        expr = 'mcp_sandbox_tool_calls_total{tool="execute_python",outcome="ok"}'
        assert wait_until(lambda: value(prom_port, expr) == 3, timeout=30), query(prom_port, expr)
        # A histogram Prometheus understands: a quantile over the calls' durations.
        q = 'histogram_quantile(0.5, rate(mcp_sandbox_tool_call_duration_seconds_bucket{tool="execute_python"}[1m]))'
        assert wait_until(lambda: value(prom_port, q) is not None, timeout=30)
        assert value(prom_port, "mcp_sandbox_ready") == 1
        # The rules file, loaded: every group there, every rule evaluated without error, the
        # recording rules computed from the server's series, and no alert firing.
        def rules_ok():
            with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=5) as r:
                groups = json.loads(r.read())["data"]["groups"]
            rules = [rule for g in groups for rule in g["rules"]]
            return (len(groups) == 2 and len(rules) >= 15 and
                    all(rule.get("health") == "ok" for rule in rules)), groups
        assert wait_until(lambda: rules_ok()[0], timeout=60), rules_ok()[1]
        rec = 'mcp_sandbox:tool_calls:rate5m{tool="execute_python",outcome="ok"}'
        assert wait_until(lambda: (value(prom_port, rec) or 0) > 0, timeout=60), query(prom_port, rec)
        assert value(prom_port, 'mcp_sandbox:run_limit_kills:rate5m{limit="timeout"}') == 0
        assert query(prom_port, 'ALERTS{alertstate="firing"}') == []
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=15)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()
        assert srv.close() == 0
