"""Files in, files and plots out, and results a model can act on: input files, outputs/
collected as image / resource / resource_link content, resources/list and resources/read
until the TTL, the matplotlib start-up hook, hostile outputs, per-call network, and the
declared outputSchema.  Stdlib only; runs on both backends (MPS_TEST_BACKEND)."""
import base64
import hashlib
import io
import json
import os
import socket
import struct
import threading
import time
import zlib

import pytest

from conftest import BACKEND, Server, wait_until, work_left


def text_of(res):
    return res["content"][0]["text"]


def blocks(res, kind):
    return [c for c in res["content"] if c["type"] == kind]


def files_of(res):
    return {f["path"]: f for f in res["structuredContent"]["files"]}


def tiny_png(width=3, height=2, rgb=(255, 0, 0)):
    """A valid PNG built with zlib and struct (the same code runs in the sandbox)."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


PNG_WRITER = '''
import os, struct, zlib
def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
def tiny_png(width=3, height=2, rgb=(255, 0, 0)):
    raw = b"".join(b"\\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
'''

# A stand-in for matplotlib, passed as input files next to the script: just enough of
# pyplot for the runner's hook (figure, get_fignums, savefig), writing a real PNG.
FAKE_PYPLOT = PNG_WRITER + '''
_figures = []
_current = None
def figure(num=None):
    global _current
    if num is None:
        num = (max(_figures) if _figures else 0) + 1
    if num not in _figures:
        _figures.append(num)
    _current = num
    return num
def get_fignums():
    return sorted(_figures)
def close(num=None):
    _figures.remove(_current if num is None else num)
def savefig(path):
    with open(path, "wb") as f:
        f.write(tiny_png(width=_current, height=1, rgb=(0, 0, 255)))
'''
FAKE_MATPLOTLIB = [
    {"path": "matplotlib/__init__.py", "content": ""},
    {"path": "matplotlib/pyplot.py", "content": FAKE_PYPLOT},
]


class BufferedServer(Server):
    """conftest's reader takes a line from an unbuffered pipe a byte per read(), which costs
    seconds for a 7 MB resources/read answer: read through a buffer instead."""

    def _read(self):
        for line in io.BufferedReader(self.proc.stdout, 1 << 16):
            self.lines.put(line)
        self.lines.put(None)


@pytest.fixture
def files_server(make_server):
    s = make_server("--artifact-ttl", "60")
    s.initialize()
    return s


# ------------------------------------------------------------------ outputs

def test_png_written_by_hand_comes_back_as_image(files_server):
    res = files_server.execute(PNG_WRITER + '''
os.makedirs("outputs", exist_ok=True)
with open("outputs/plot.png", "wb") as f:
    f.write(tiny_png())
print("done")
''')
    assert res["isError"] is False, text_of(res)
    assert res["content"][0]["type"] == "text" and text_of(res).startswith("--- stdout ---\ndone\n")
    images = blocks(res, "image")
    assert len(images) == 1 and images[0]["mimeType"] == "image/png"
    assert base64.b64decode(images[0]["data"]) == tiny_png()
    f = files_of(res)["outputs/plot.png"]
    assert f["returned"] == "image" and f["mime_type"] == "image/png" and f["size"] == len(tiny_png())
    assert "--- file: outputs/plot.png (image/png" in text_of(res)


def test_image_type_is_sniffed_not_taken_from_the_name(files_server):
    res = files_server.execute(PNG_WRITER + '''
os.makedirs("outputs", exist_ok=True)
open("outputs/picture.txt", "wb").write(tiny_png())
open("outputs/fake.png", "w").write("not a png at all\\n")
''')
    f = files_of(res)
    assert f["outputs/picture.txt"]["returned"] == "image"
    assert f["outputs/picture.txt"]["mime_type"] == "image/png"
    assert f["outputs/fake.png"]["returned"] == "resource"
    assert f["outputs/fake.png"]["mime_type"] == "text/plain"


def test_matplotlib_figures_left_open_are_saved(files_server):
    script = '''
import sys
import matplotlib.pyplot as plt
plt.figure()
plt.figure()
print("figures:", plt.get_fignums())
'''
    res = files_server.execute(script, files=FAKE_MATPLOTLIB)
    assert res["isError"] is False, text_of(res)
    images = blocks(res, "image")
    assert [base64.b64decode(i["data"]) for i in images] == [
        tiny_png(width=1, height=1, rgb=(0, 0, 255)), tiny_png(width=2, height=1, rgb=(0, 0, 255))]
    f = files_of(res)
    assert f["outputs/figure-1.png"]["returned"] == "image"
    assert f["outputs/figure-2.png"]["returned"] == "image"


def test_matplotlib_hook_runs_on_failure_and_keeps_tracebacks_true(files_server):
    script = '''import matplotlib.pyplot as plt
plt.figure()

def broken():
    raise RuntimeError("boom")

broken()
'''
    res = files_server.execute(script, files=FAKE_MATPLOTLIB)
    assert res["isError"] is True and res["structuredContent"]["exit_code"] == 1
    err = res["structuredContent"]["stderr"]
    assert err.startswith("Traceback (most recent call last):\n"), err
    assert 'script.py", line 7, in <module>' in err and 'script.py", line 5, in broken' in err
    assert "runner" not in err and "runpy" not in err
    assert err.rstrip().endswith("RuntimeError: boom")
    assert files_of(res)["outputs/figure-1.png"]["returned"] == "image"
    # A figure saved by hand under the hook's name is kept; the hook picks another name.
    res = files_server.execute(
        "import os, matplotlib.pyplot as plt\nos.makedirs('outputs')\nopen('outputs/figure-1.png', 'w').write('mine')\n"
        "plt.figure()\nraise SystemExit(3)\n", files=FAKE_MATPLOTLIB)
    assert res["structuredContent"]["exit_code"] == 3
    f = files_of(res)
    assert f["outputs/figure-1.png"]["returned"] == "resource"
    assert f["outputs/figure-1-2.png"]["returned"] == "image"


def test_runner_is_invisible_to_scripts(files_server):
    script = '''import os, sys
print(sys.argv)
print(__file__ == os.path.join(os.getcwd(), "script.py"))
print(sys.path[0] == os.getcwd())
print(__name__, __spec__, __package__, __cached__)
print(sorted(k for k in globals() if not k.startswith("__")))
print("matplotlib" in sys.modules, "runpy" in sys.modules)
print(type(__loader__).__name__, __loader__.name)
import inspect
print(inspect.getsource(sys.modules["__main__"]).splitlines()[0])
'''
    res = files_server.execute(script)
    out = res["structuredContent"]["stdout"].splitlines()
    assert out == ["['script.py']", "True", "True", "__main__ None None None", "['os', 'sys']",
                   "False False", "SourceFileLoader __main__", "import os, sys"], out
    res = files_server.execute("x = (\n")
    err = res["structuredContent"]["stderr"]
    assert res["structuredContent"]["exit_code"] == 1
    assert "Traceback" not in err and 'script.py", line 1' in err and "SyntaxError" in err, err


def test_runner_runs_compiled_and_stays_invisible(files_server):
    """After its first use the runner starts as bytecode compiled by the interpreter
    (<state>/runner/*.pyc): the same behaviour, without compiling it on every call."""
    def cmdline():
        return files_server.execute("print(open('/proc/self/cmdline').read().replace(chr(0), ' '))")[
            "structuredContent"]["stdout"]
    assert wait_until(lambda: ".pyc script.py" in cmdline(), timeout=30, interval=0.2)
    assert "runner.py" not in cmdline()
    test_runner_is_invisible_to_scripts(files_server)
    test_matplotlib_hook_runs_on_failure_and_keeps_tracebacks_true(files_server)
    test_matplotlib_figures_left_open_are_saved(files_server)
    test_runner_ends_without_finalisation_keeping_what_the_script_wrote(files_server)
    test_runner_exit_statuses_are_pythons(files_server)


def embedded_texts(res):
    by_uri = {b["resource"]["uri"]: b["resource"]["text"] for b in blocks(res, "resource")}
    return {path: by_uri.get(f["uri"]) for path, f in files_of(res).items()}


def test_runner_ends_without_finalisation_keeping_what_the_script_wrote(files_server):
    """The runner ends a script with os._exit once the non-daemon threads are joined, the
    atexit handlers ran and stdout/stderr are flushed: the interpreter's finalisation is
    skipped, and nothing the script wrote is lost."""
    script = '''import atexit, os, sys, threading, time
def bye():
    print("atexit")
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/atexit.txt", "w") as f:
        f.write("from atexit")
atexit.register(bye)
threading.Thread(target=lambda: (time.sleep(0.2), print("thread"))).start()
sys.stdout.write("unflushed ")
sys.stderr.write("err unflushed")
sys.exit(5)
'''
    sc = files_server.execute(script)
    res = sc
    sc = sc["structuredContent"]
    assert sc["exit_code"] == 5, sc
    assert sc["stdout"] == "unflushed thread\natexit\n", sc
    assert sc["stderr"] == "err unflushed", sc
    assert embedded_texts(res) == {"outputs/atexit.txt": "from atexit"}
    # Finalisation is skipped: an object alive in a module other than the script's is not
    # finalised (Python does not promise that it is).
    sc = files_server.execute(
        "import sys, types\n"
        "sys.modules['holder'] = types.SimpleNamespace(d=type('D', (), {'__del__': lambda self: print('finalised')})())\n"
        "print('end')\n")["structuredContent"]
    assert sc["exit_code"] == 0 and sc["stdout"] == "end\n", sc
    # What only finalisation would flush or run takes the normal way: files left open for
    # writing (in the namespace or deeper), a class of the script's with a finaliser.
    res = files_server.execute('''import os
os.makedirs("outputs")
f = open("outputs/open.txt", "w")
f.write("left open")
keep = [open("outputs/deep.txt", "w")]
keep[0].write("in a list")
class Noisy:
    def __del__(self):
        print("finalised")
n = Noisy()
print("end")
''')
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0 and sc["stdout"] == "end\nfinalised\n", sc
    assert embedded_texts(res) == {"outputs/open.txt": "left open", "outputs/deep.txt": "in a list"}
    res = files_server.execute("import os\nos.makedirs('outputs')\nkeep = [open('outputs/deep.txt', 'w')]\n"
                               "keep[0].write('alone in a list')\n")
    assert embedded_texts(res) == {"outputs/deep.txt": "alone in a list"}, res


def test_runner_exit_statuses_are_pythons(files_server):
    def run(script):
        return files_server.execute(script)["structuredContent"]
    for code, status in (("None", 0), ("0", 0), ("3", 3), ("True", 1), ("256", 0), ("-1", 255)):
        sc = run(f"import atexit, sys\natexit.register(print, 'atexit')\nsys.exit({code})\n")
        assert sc["exit_code"] == status, (code, sc)
        assert sc["stdout"] == "atexit\n", (code, sc)
    sc = run("import sys\nprint('out')\nsys.exit('a message')\n")
    assert sc["exit_code"] == 1 and sc["stdout"] == "out\n" and sc["stderr"] == "a message\n", sc
    sc = run("import atexit\natexit.register(print, 'atexit')\nraise ValueError('boom')\n")
    assert sc["exit_code"] == 1 and sc["stdout"] == "atexit\n", sc
    assert sc["stderr"].startswith("Traceback") and sc["stderr"].endswith("ValueError: boom\n"), sc
    # A handler that fails is reported as Python reports it, and the status stays.
    sc = run("import atexit\natexit.register(lambda: 1 / 0)\nprint('end')\n")
    assert sc["exit_code"] == 0 and sc["stdout"] == "end\n", sc
    assert "ZeroDivisionError" in sc["stderr"], sc


def test_text_and_binary_outputs(files_server):
    res = files_server.execute('''
import os
os.makedirs("outputs/tables", exist_ok=True)
open("outputs/tables/data.csv", "w").write("a,b\\n1,2\\n")
open("outputs/notes.md", "w", encoding="utf-8").write("# Résumé\\n")
open("outputs/blob.bin", "wb").write(bytes(range(256)))
open("outputs/empty.txt", "w").close()
''')
    assert res["isError"] is False
    f = files_of(res)
    assert f["outputs/tables/data.csv"]["returned"] == "resource"
    assert f["outputs/tables/data.csv"]["mime_type"] == "text/csv"
    assert f["outputs/notes.md"]["mime_type"] == "text/markdown"
    assert f["outputs/blob.bin"]["returned"] == "resource_link"
    assert f["outputs/blob.bin"]["mime_type"] == "application/octet-stream"
    embedded = {b["resource"]["uri"]: b["resource"] for b in blocks(res, "resource")}
    csv = embedded[f["outputs/tables/data.csv"]["uri"]]
    assert csv["text"] == "a,b\n1,2\n" and csv["mimeType"] == "text/csv"
    assert embedded[f["outputs/notes.md"]["uri"]]["text"] == "# Résumé\n"
    link = blocks(res, "resource_link")[0]
    assert link["uri"] == f["outputs/blob.bin"]["uri"] and link["size"] == 256
    assert link["uri"].startswith("sandbox://runs/") and link["uri"].endswith("/outputs/blob.bin")
    read = files_server.request("resources/read", {"uri": link["uri"]})["result"]["contents"][0]
    assert base64.b64decode(read["blob"]) == bytes(range(256))
    # Embedded texts can be read back as well.
    read = files_server.request("resources/read", {"uri": csv["uri"]})["result"]["contents"][0]
    assert read["text"] == "a,b\n1,2\n" and read["mimeType"] == "text/csv"
    # Content order: the text block first, then images and resources.
    assert [c["type"] for c in res["content"]][0] == "text"


def test_no_outputs_no_files(files_server):
    res = files_server.execute("print('x')")
    assert res["structuredContent"]["files"] == [] and len(res["content"]) == 1
    assert "--- files:" not in text_of(res)


def test_empty_outputs_directory_no_files(files_server):
    # An empty outputs/ (and an empty directory in it) is no files, not a crash: the
    # sanitizer build once aborted here (qsort of no names).
    res = files_server.execute("import os\nos.makedirs('outputs/empty')\nprint('made')")
    assert not res.get("isError"), res
    assert "--- stdout ---\nmade\n" in text_of(res)
    assert res["structuredContent"]["files"] == [] and len(res["content"]) == 1
    res = files_server.execute("import os\nos.makedirs('outputs')\nprint('only outputs')")
    assert "only outputs" in text_of(res) and res["structuredContent"]["files"] == []
    assert files_server.request("ping")["result"] == {}


@pytest.fixture
def buffered_server():
    made = []

    def make(*args, **kwargs):
        s = BufferedServer(*args, **kwargs)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def test_large_output_is_a_resource_link_until_the_ttl(buffered_server):
    s = buffered_server("--artifact-ttl", "2")
    s.initialize()
    res = s.execute('''
import hashlib, os
os.makedirs("outputs", exist_ok=True)
data = os.urandom(5 * 1024 * 1024)
open("outputs/big.bin", "wb").write(data)
print(hashlib.sha256(data).hexdigest())
''')
    digest = res["structuredContent"]["stdout"].strip()
    runs = os.path.join(s.state_dir, "runs")
    assert len(os.listdir(runs)) == 1
    assert oct(os.stat(os.path.join(runs, os.listdir(runs)[0])).st_mode & 0o777) == "0o700"
    links = blocks(res, "resource_link")
    assert len(links) == 1 and links[0]["size"] == 5 * 1024 * 1024
    uri = links[0]["uri"]
    # The text names the link, not a method the host may not offer its model (issue 36).
    assert "resources/read" not in text_of(res) and uri in text_of(res)
    listed = s.request("resources/list")["result"]["resources"]
    assert [r["uri"] for r in listed] == [uri] and listed[0]["size"] == 5 * 1024 * 1024
    read = s.request("resources/read", {"uri": uri}, timeout=30)["result"]["contents"][0]
    assert read["uri"] == uri and read["mimeType"] == "application/octet-stream"
    assert hashlib.sha256(base64.b64decode(read["blob"])).hexdigest() == digest
    time.sleep(3)
    gone = s.request("resources/read", {"uri": uri})
    assert gone["error"]["code"] == -32002 and gone["error"]["data"] == {"uri": uri}
    assert s.request("resources/list")["result"]["resources"] == []
    assert os.listdir(runs) == []


def test_resources_protocol(files_server):
    caps = None
    s = Server()
    try:
        caps = s.initialize()["capabilities"]
    finally:
        s.close()
    assert caps["resources"] == {"listChanged": False, "subscribe": False}
    t = files_server.request("resources/templates/list")["result"]["resourceTemplates"]
    assert t[0]["uriTemplate"].startswith("sandbox://runs/{run_id}/") and t[0]["name"]
    r = files_server.request("resources/read", {"uri": "sandbox://runs/0123/outputs/x"})
    assert r["error"]["code"] == -32002 and r["error"]["data"] == {"uri": "sandbox://runs/0123/outputs/x"}
    assert files_server.request("resources/read", {})["error"]["code"] == -32602
    assert files_server.request("resources/read", {"uri": 5})["error"]["code"] == -32602
    assert files_server.request("resources/list", {"cursor": "nope"})["error"]["code"] == -32602
    assert files_server.request("resources/templates/list", {"cursor": "x"})["error"]["code"] == -32602
    assert files_server.request("resources/list")["result"] == {"resources": []}


def test_resources_list_pages(make_server):
    s = make_server("--max-output-files", "150")
    s.initialize()
    res = s.execute("import os\nos.makedirs('outputs')\nfor i in range(150):\n"
                    "    open(f'outputs/f{i:03}.bin', 'wb').write(b'\\0' * 10)\n")
    assert len(res["structuredContent"]["files"]) == 150
    page = s.request("resources/list")["result"]
    assert len(page["resources"]) == 100 and "nextCursor" in page
    page2 = s.request("resources/list", {"cursor": page["nextCursor"]})["result"]
    assert len(page2["resources"]) == 50 and "nextCursor" not in page2
    names = [r["name"] for r in page["resources"] + page2["resources"]]
    assert names == [f"outputs/f{i:03}.bin" for i in range(150)]


def test_artifact_caps(make_server):
    s = make_server("--max-artifact-bytes", "1M", "--max-artifact-store-bytes", "1M")
    s.initialize()
    writer = "import os\nos.makedirs('outputs')\nopen('outputs/a.bin', 'wb').write(b'\\1' * {n})\n"
    res = s.execute(writer.format(n=2 * 1024 * 1024))
    f = files_of(res)["outputs/a.bin"]
    assert f["returned"] == "skipped" and "budget" in f["reason"]
    first = s.execute(writer.format(n=600 * 1024))
    uri = files_of(first)["outputs/a.bin"]["uri"]
    assert "result" in s.request("resources/read", {"uri": uri})
    second = s.execute(writer.format(n=600 * 1024))
    assert files_of(second)["outputs/a.bin"]["returned"] == "resource_link"
    # The store holds 1M in all: the older run made room.
    assert s.request("resources/read", {"uri": uri})["error"]["code"] == -32002


def test_hostile_outputs_are_skipped(files_server):
    res = files_server.execute('''
import os
os.makedirs("outputs/deep", exist_ok=True)
os.symlink("/etc/shadow", "outputs/shadow")
os.symlink("/etc", "outputs/etc")
os.symlink("../script.py", "outputs/script")
os.mkfifo("outputs/fifo")
os.symlink("/etc", "outputs_link")
d = "outputs/deep"
for i in range(12):
    d += "/d"
os.makedirs(d)
open(d + "/bottom.txt", "w").write("deep")
open("outputs/ok.txt", "w").write("fine")
''', timeout=30)
    assert res["isError"] is False, text_of(res)
    f = files_of(res)
    for p in ("outputs/shadow", "outputs/etc", "outputs/script"):
        assert f[p]["returned"] == "skipped" and "symbolic link" in f[p]["reason"]
    assert f["outputs/fifo"]["returned"] == "skipped" and "FIFO" in f["outputs/fifo"]["reason"]
    assert f["outputs/ok.txt"]["returned"] == "resource"
    deep = [p for p in f if p.startswith("outputs/deep/")]
    assert len(deep) == 1 and "levels" in f[deep[0]]["reason"]
    assert "root:" not in str(res)
    assert "--- skipped: outputs/shadow: a symbolic link" in text_of(res)


def test_control_characters_in_output_names_are_escaped(files_server):
    """issue 31 (6): an ESC sequence or a bidi override in a name a script chose came back raw
    in structuredContent.files[].path and the text.  Now every reported name is escaped."""
    res = files_server.execute(r'''
import os
os.makedirs("outputs")
os.mkfifo("outputs/fifo\x1b[31mred")
os.symlink("/etc", "outputs/link\u202etxt.exe")
open("outputs/ok\x07bell.txt", "w").write("fine")
open("outputs/caf\u00e9.txt", "w").write("accents stay")
''', timeout=30)
    assert res["isError"] is False, text_of(res)
    f = files_of(res)
    assert f["outputs/fifo\\x1b[31mred"]["returned"] == "skipped", list(f)
    assert f["outputs/link\\u{202e}txt.exe"]["returned"] == "skipped", list(f)
    assert f["outputs/ok\\x07bell.txt"]["returned"] == "skipped", list(f)  # (never returned)
    assert f["outputs/caf\u00e9.txt"]["returned"] == "resource", list(f)
    everything = json.dumps(res, ensure_ascii=False)
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in everything and raw not in text_of(res)


def test_outputs_itself_a_symlink_is_not_followed(files_server):
    res = files_server.execute("import os\nos.symlink('/etc', 'outputs')\n")
    f = files_of(res)
    assert list(f) == ["outputs"] and f["outputs"]["returned"] == "skipped"
    assert "nothing was collected" in f["outputs"]["reason"]


def test_a_hundred_thousand_tiny_files_stop_at_the_cap(make_server):
    s = make_server("--max-output-files", "50")
    s.initialize()
    res = s.execute('''
import os
os.makedirs("outputs")
for i in range(100000):
    with open("outputs/%06d.txt" % i, "w") as f:
        f.write("x")
print("made")
''', timeout_seconds=240, timeout=300)
    assert res["structuredContent"]["stdout"] == "made\n", text_of(res)
    files = res["structuredContent"]["files"]
    # Which 50 is up to the directory's order; they are listed sorted by name.
    assert len(files) == 50 and [f["path"] for f in files] == sorted(f["path"] for f in files)
    assert "holds more than 50 entries" in text_of(res)
    # The work directory went too (how long collecting and removing take: bench/ case 8).
    assert wait_until(lambda: work_left(s.state_dir) == [], timeout=60)
    assert s.request("ping")["result"] == {}


# ------------------------------------------------------------------ inputs

def test_input_files_are_written_before_the_script(files_server):
    payload = bytes(range(256)) * 3
    res = files_server.execute('''
import os
print(open("data/in.txt", encoding="utf-8").read())
print(open("deep/a/b/c.bin", "rb").read() == bytes(range(256)) * 3)
print(oct(os.stat("data").st_mode & 0o777), sorted(os.listdir(".")))
''', files=[{"path": "data/in.txt", "content": "héllo"},
            {"path": "./deep/a/b/c.bin", "content": base64.b64encode(payload).decode(), "encoding": "base64"}])
    assert res["isError"] is False, text_of(res)
    out = res["structuredContent"]["stdout"].splitlines()
    assert out == ["héllo", "True", "0o755 ['data', 'deep', 'script.py']"]
    # Inputs are not outputs.
    assert res["structuredContent"]["files"] == []


@pytest.mark.parametrize("files, needle", [
    ([{"path": "../x", "content": "a"}], "'..'"),
    ([{"path": "a/../../x", "content": "a"}], "'..'"),
    ([{"path": "a/..", "content": "a"}], "'..'"),
    ([{"path": "/etc/x", "content": "a"}], "absolute"),
    ([{"path": "a\\b", "content": "a"}], "backslash"),
    ([{"path": "a//b", "content": "a"}], "empty component"),
    ([{"path": "", "content": "a"}], "empty"),
    ([{"path": "script.py", "content": "a"}], "script itself"),
    ([{"path": "x", "content": "a"}, {"path": "./x", "content": "b"}], "both write"),
    ([{"path": "x", "content": "a"}, {"path": "x/y", "content": "b"}], "not a directory"),
    ([{"path": "x" * 300, "content": "a"}], "255 bytes"),
    ([{"path": "/".join(["d"] * 20), "content": "a"}], "16 directories"),
    ([{"path": "x", "content": "!!!!", "encoding": "base64"}], "not valid base64"),
    ([{"path": "x", "content": "QUJD=A", "encoding": "base64"}], "not valid base64"),
    ([{"path": "x", "content": "a", "encoding": "latin-1"}], "encoding"),
    ([{"path": "x", "content": 5}], "content must be a string"),
    ([{"path": "x", "content": "a", "mode": 7}], "unknown key"),
    (["x"], "must be an object"),
    ({"path": "x"}, "must be a list"),
])
def test_bad_input_files_are_refused(files_server, files, needle):
    res = files_server.execute("print('ran')", files=files)
    assert res["isError"] is True
    assert needle in text_of(res), text_of(res)
    assert "ran" not in text_of(res)


def test_nul_in_a_path_never_reaches_the_tool(files_server):
    # JSON-RPC texts with \u0000 are refused whole (files_check_path refuses NUL as well,
    # see tests/unit/test_files.c).
    files_server.send_raw(b'{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"execute_python",'
                          b'"arguments":{"script":"print(1)","files":[{"path":"a\\u0000b","content":""}]}}}\n')
    err = files_server.recv()
    assert err["id"] is None and err["error"]["code"] in (-32700, -32600)
    assert files_server.request("ping")["result"] == {}


def test_input_file_limits(make_server):
    s = make_server("--max-input-files", "3", "--max-input-file-bytes", "1K", "--max-input-bytes", "2K")
    s.initialize()
    res = s.execute("pass", files=[{"path": f"f{i}", "content": ""} for i in range(4)])
    assert res["isError"] and "At most 3 input files" in text_of(res)
    res = s.execute("pass", files=[{"path": "big", "content": "x" * 1025}])
    assert res["isError"] and "too large" in text_of(res)
    res = s.execute("pass", files=[{"path": "big", "content": base64.b64encode(b"x" * 1025).decode(),
                                    "encoding": "base64"}])
    assert res["isError"] and "too large" in text_of(res)
    res = s.execute("pass", files=[{"path": f"f{i}", "content": "x" * 1000} for i in range(3)])
    assert res["isError"] and "2048 bytes for all files" in text_of(res)
    res = s.execute("print(len(open('f1').read()))",
                    files=[{"path": f"f{i}", "content": "x" * 1000} for i in range(2)])
    assert res["isError"] is False and res["structuredContent"]["stdout"] == "1000\n"


# ------------------------------------------------------------------ network

@pytest.fixture
def loopback_listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                c.sendall(b"hello")
                c.close()
            except OSError:
                pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    srv.close()


CONNECT = '''
import socket
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=3)
    print("connected", s.recv(5).decode())
except OSError as e:
    print("refused", type(e).__name__)
'''


@pytest.mark.skipif(BACKEND != "bwrap", reason="only a sandbox with its own network namespace can turn it off")
def test_network_false_blocks_loopback_for_that_call_only(make_server, loopback_listener):
    # Only --network host shares the host's loopback with scripts (the default refuses it:
    # test_network.py); network: false still takes even that away, for that call only.
    s = make_server("--network", "host")
    s.initialize()
    script = CONNECT.format(port=loopback_listener)
    assert s.execute(script)["structuredContent"]["stdout"] == "connected hello\n"
    res = s.execute(script, network=False)
    assert res["structuredContent"]["stdout"].startswith("refused"), text_of(res)
    assert s.execute(script, network=True)["structuredContent"]["stdout"] == "connected hello\n"


@pytest.mark.skipif(BACKEND != "none", reason="the none backend cannot isolate the network")
def test_network_false_without_isolation_says_so(files_server):
    res = files_server.execute("print(1)", network=False)
    assert res["isError"] is False
    assert "network: false was not enforced" in text_of(res)


@pytest.mark.skipif(BACKEND != "none", reason="the none backend cannot isolate the network")
def test_network_list_without_isolation_is_refused(files_server):
    # A list asks for less than the network; run anyway, the script would get all of it.
    res = files_server.execute("print('ran')", network=["pypi.org"])
    assert res["isError"] is True, text_of(res)
    assert "cannot be enforced" in text_of(res) and "ran" not in text_of(res)
    # The tool's description does not promise a policy this backend cannot apply.
    tool = {t["name"]: t for t in files_server.request("tools/list")["result"]["tools"]}["execute_python"]
    assert "not filtered" in tool["description"] and "egress proxy" not in tool["description"]
    assert "a list of destinations is refused" in tool["inputSchema"]["properties"]["network"]["description"]


def test_network_argument_checks(make_server):
    s = make_server("--network", "off")
    s.initialize()
    res = s.execute("print(1)", network=True)
    assert res["isError"] is True and "--network off" in text_of(res)
    res = s.execute("print(1)", network=False)
    assert res["isError"] is False and res["structuredContent"]["stdout"] == "1\n"
    res = s.execute("print(1)", network="no")
    assert res["isError"] is True and "true, false, or a list" in text_of(res)
    res = s.execute("print(1)", network=["pypi.org"])
    assert res["isError"] is True and "--network off" in text_of(res)
    tools = {t["name"]: t for t in s.request("tools/list")["result"]["tools"]}
    assert tools["execute_python"]["annotations"]["openWorldHint"] is False


# ------------------------------------------------------------------ schema

JSON_TYPES = {"string": str, "integer": int, "boolean": bool, "object": dict, "array": list,
              "null": type(None), "number": (int, float)}


def check_type(value, schema, where):
    types = schema.get("type")
    if types is None:
        return
    types = types if isinstance(types, list) else [types]
    ok = any(isinstance(value, JSON_TYPES[t]) and not (t in ("integer", "number") and isinstance(value, bool))
             for t in types)
    assert ok, f"{where}: {value!r} is not {types}"
    if isinstance(value, dict):
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                check_type(value[k], sub, f"{where}.{k}")
        for k in schema.get("required", []):
            assert k in value, f"{where}: missing {k}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check_type(item, schema["items"], f"{where}[{i}]")
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"


def test_structured_content_matches_the_output_schema(files_server):
    tools = {t["name"]: t for t in files_server.request("tools/list")["result"]["tools"]}
    tool = tools["execute_python"]
    schema = tool["outputSchema"]
    # What every result has, declared; details: true adds metadata the schema allows unlisted
    # (tools/list is in every agent's context: issue 36).
    assert schema["required"] == ["stdout", "stderr", "exit_code"]
    assert {"stdout", "stderr", "exit_code", "error", "files", "run_id"} <= set(schema["properties"])
    assert schema.get("additionalProperties", True) is True
    for name, prop in schema["properties"].items():
        assert "type" in prop, name
    inputs = tool["inputSchema"]["properties"]
    assert inputs["files"]["type"] == "array"
    assert [t["type"] for t in inputs["network"]["anyOf"]] == ["boolean", "array"]
    assert tool["annotations"]["openWorldHint"] is True
    desc = tool["description"]
    for needle in ("outputs/", "# /// script", "dependencies", "figure", "background", "wait_run"):
        assert needle in desc, needle
    assert "resources/read" not in desc
    cases = [
        (PNG_WRITER + "os.makedirs('outputs')\nopen('outputs/p.png','wb').write(tiny_png())\n"
         "os.symlink('/etc/passwd', 'outputs/l')\nopen('outputs/b.bin','wb').write(b'\\0\\1')\n", {}),
        ("import sys\nsys.exit(4)\n", {}),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", {}),
        ("while True: pass\n", {"timeout_seconds": 1}),
    ]
    for script, extra in cases:
        for details in (False, True):
            res = files_server.execute(script, details=details, **extra)
            check_type(res["structuredContent"], schema, "structuredContent")
    sc = res["structuredContent"]
    assert res["isError"] is True and sc["timed_out"] is True and sc["limit"] == "timeout"


def test_is_error_on_failure_kill_and_timeout(files_server):
    assert files_server.execute("import sys; sys.exit(2)")["isError"] is True
    res = files_server.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert res["isError"] is True and res["structuredContent"]["signal"] == 9
    res = files_server.execute("import os\nos.makedirs('outputs')\nopen('outputs/x.txt','w').write('partial')\n"
                               "while True: pass\n", timeout_seconds=1)
    assert res["isError"] is True and res["structuredContent"]["timed_out"] is True
    # What a timed-out script wrote is still returned.
    assert files_of(res)["outputs/x.txt"]["returned"] == "resource"
