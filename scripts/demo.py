"""A scripted MCP session over stdio against the real binary (stdlib only)."""
import base64
import json
import os
import subprocess
import sys

binary, flags = sys.argv[1], sys.argv[2:]
proc = subprocess.Popen([binary, *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def rpc(msg_id, method, params=None):
    msg = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        msg["params"] = params
    proc.stdin.write(json.dumps(msg) + "\n")
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline()
        if not line:
            sys.exit("the server closed its output")
        reply = json.loads(line)
        if reply.get("id") == msg_id:
            return reply


init = rpc(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                             "clientInfo": {"name": "demo", "version": "1"}})["result"]
proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
print(f"  server: {init['serverInfo']['name']} {init['serverInfo']['version']}, "
      f"protocol {init['protocolVersion']}")
tools = rpc(2, "tools/list")["result"]["tools"]
print("  tools:", ", ".join(t["name"] for t in tools))
script = "import sys, platform\nprint('hello from', platform.python_implementation(), platform.python_version())\n"
print("  execute_python:", json.dumps(script))
res = rpc(3, "tools/call", {"name": "execute_python", "arguments": {"script": script}})["result"]
for line in res["content"][0]["text"].splitlines():
    print("    " + line)
# A plot, with Debian's matplotlib when the system interpreter has it (no index needed).
system = "/usr/bin/python3"
probe = subprocess.run([system, "-I", "-c", "import platform, numpy, matplotlib; print(platform.python_version())"],
                       capture_output=True, text=True) if os.access(system, os.X_OK) else None
if probe and probe.returncode == 0:
    plot = ("import numpy as np, matplotlib.pyplot as plt\n"
            "x = np.linspace(0, 2 * np.pi, 200)\nplt.plot(x, np.sin(x))\nplt.title('hello from the sandbox')\n")
    version = probe.stdout.strip()
    print(f"  execute_python (a plot with Debian's matplotlib, python_version {version!r}):")
    res_plot = rpc(5, "tools/call", {"name": "execute_python",
                                     "arguments": {"script": plot, "python_version": version}})["result"]
    images = [c for c in res_plot["content"] if c.get("type") == "image"]
    if images:
        out = os.path.join(os.path.dirname(os.path.abspath(binary)), "demo-plot.png")
        with open(out, "wb") as f:
            f.write(base64.b64decode(images[0]["data"]))
        print(f"    the plot: {out}")
    else:
        for line in res_plot["content"][0]["text"].splitlines()[-12:]:
            print("    " + line)
else:
    print("  plots: apt-get install python3-matplotlib (Debian's, seen by /usr/bin/python3), "
          "or wheels in a directory with --find-links DIR --offline (README: Offline)")
env = rpc(4, "tools/call", {"name": "check_environment", "arguments": {}})["result"]
print("  check_environment:")
for line in env["content"][0]["text"].splitlines():
    print("    " + line)
proc.stdin.close()
proc.wait(timeout=10)
sys.exit(1 if res.get("isError") else 0)
