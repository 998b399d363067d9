#!/usr/bin/env python3
"""What a model receives of one execute_python result in each host's presentation (issue 36):
bytes of text and estimated tokens (bytes / 4), for a success, an error and a plot, from a
server binary over stdio.  Prints a Markdown table (docs/hosts.md has the numbers).

    bench/host_presentations.py BINARY [LABEL]

The presentations, as the hosts' code builds them (images are counted apart: they reach the
model as images where the host passes them on):
  Claude Code  structuredContent as JSON when the result has one, else the text blocks
  Codex        the same; images and embedded files dropped
  Gemini CLI   the text blocks and structuredContent as JSON
  AI SDK       @ai-sdk/mcp's toModelOutput: the text blocks (images as file parts, other blocks as JSON)
  LangChain    @langchain/mcp-adapters: the text blocks (an error: a ToolException with them)
"""
import json
import subprocess
import sys
import tempfile

SCRIPTS = {
    "success": "print('hello')",
    "error": "def f(x):\n    return 1 / x\n\nf(0)\n",
    "plot": ("import os, zlib, struct\n"
             "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n"
             "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0))\n"
             "png += chunk(b'IDAT', zlib.compress(b'\\x00\\xff\\x00\\x00')) + chunk(b'IEND', b'')\n"
             "os.makedirs('outputs', exist_ok=True)\nopen('outputs/figure-1.png', 'wb').write(png)\n"
             "print('saved')\n"),
}


def results(binary):
    with tempfile.TemporaryDirectory() as state:
        p = subprocess.Popen([binary, "--sandbox-backend", "none", "--state-dir", state, "--no-warm-cache"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        msgs = [{"jsonrpc": "2.0", "id": 0, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "bench", "version": "0"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"}]
        for i, (name, script) in enumerate(SCRIPTS.items(), 1):
            msgs.append({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                         "params": {"name": "execute_python", "arguments": {"script": script}}})
        msgs.append({"jsonrpc": "2.0", "id": 99, "method": "tools/list"})
        for m in msgs:
            p.stdin.write((json.dumps(m) + "\n").encode())
        p.stdin.flush()
        got = {}
        while len(got) < len(SCRIPTS) + 1:
            m = json.loads(p.stdout.readline())
            if m.get("id") in range(1, len(SCRIPTS) + 1):
                got[list(SCRIPTS)[m["id"] - 1]] = m["result"]
            elif m.get("id") == 99:
                got["tools/list"] = len(json.dumps(m, separators=(",", ":")))
        p.stdin.close()
        p.wait(timeout=30)
        return got


def texts(res):
    return "\n".join(c["text"] for c in res["content"] if c["type"] == "text")


def images(res):
    return sum(1 for c in res["content"] if c["type"] == "image")


def present(host, res):
    sc = res.get("structuredContent")
    sc_json = json.dumps(sc, separators=(",", ":")) if sc is not None else None
    if host in ("Claude Code", "Codex"):
        return sc_json if sc_json is not None else texts(res), (0 if host == "Codex" else images(res))
    if host == "Gemini CLI":
        return texts(res) + ("\n" + sc_json if sc_json else ""), images(res)
    if host == "AI SDK":
        parts = [c["text"] if c["type"] == "text" else json.dumps(c) for c in res["content"] if c["type"] != "image"]
        return "\n".join(parts), images(res)
    if host == "LangChain":
        t = texts(res)
        if res.get("isError"):
            t = "MCP tool 'execute_python' on server 'sandbox' returned an error: " + t
        return t, images(res)
    raise ValueError(host)


HOSTS = ["Claude Code", "Codex", "Gemini CLI", "AI SDK", "LangChain"]


def main():
    binary = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else binary
    got = results(binary)
    print(f"### {label}: tools/list {got.pop('tools/list')} bytes\n")
    print("| host | " + " | ".join(SCRIPTS) + " |")
    print("| --- |" + " --- |" * len(SCRIPTS))
    for host in HOSTS:
        cells = []
        for name in SCRIPTS:
            text, n_img = present(host, got[name])
            b = len(text.encode())
            cells.append(f"{b} B, ~{(b + 3) // 4} tok" + (f" + {n_img} image" if n_img else ""))
        print(f"| {host} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
