"""What a model sees of an execute_python result (issue 36): a lean structuredContent (the
output, the exit code, what went wrong, the files), the run's metadata only with details:
true, kept output once in the response, and no text naming a method the host may not offer."""
import json

def text_of(res):
    return "\n".join(c["text"] for c in res["content"] if c["type"] == "text")

LEAN = {"stdout", "stderr", "exit_code", "duration_ms", "timed_out", "truncated"}


def lean_call(s, script, **kwargs):
    return s.call("execute_python", {"script": script, **kwargs})


def test_trivial_success_is_small(server):
    res = lean_call(server, "print('hi')")
    sc = res["structuredContent"]
    assert sc["stdout"] == "hi\n" and sc["stderr"] == "" and sc["exit_code"] == 0
    assert set(sc) == LEAN, sc
    assert len(json.dumps(sc, separators=(",", ":"))) <= 300
    # The seed's text block still has it all.
    text = text_of(res)
    assert "--- stdout ---\nhi\n" in text and "--- exit_code: 0 ---" in text


def test_error_says_what_went_wrong(server):
    res = lean_call(server, "x = 1\n1 / 0\n")
    assert res["isError"] is True
    sc = res["structuredContent"]
    assert sc["exit_code"] == 1
    assert sc["error"] == "exit code 1: ZeroDivisionError: division by zero"
    assert "Traceback" in sc["stderr"]
    res = lean_call(server, "import time\ntime.sleep(30)\n", timeout_seconds=1)
    sc = res["structuredContent"]
    assert sc["timed_out"] is True and sc["error"].startswith("timed out after 1 s")


def test_details_carry_the_metadata(server):
    res = lean_call(server, "print('hi')", details=True)
    sc = res["structuredContent"]
    for key in ("sandbox", "python", "cpu_user_ms", "prestarted", "environment", "network",
                "stdout_bytes", "limit", "status_confirmed", "max_rss_kib"):
        assert key in sc, key
    res = lean_call(server, "print('hi')", details="yes")
    assert res["isError"] is True and "'details' must be true or false" in text_of(res)


def test_files_have_names_and_sizes_and_no_resources_read(server):
    script = ("import os\nos.makedirs('outputs')\nopen('outputs/a.txt','w').write('abc')\n"
              "open('outputs/b.bin','wb').write(bytes(range(256)) * 4)\n")
    res = lean_call(server, script)
    files = {f["path"]: f for f in res["structuredContent"]["files"]}
    assert files["outputs/a.txt"]["size"] == 3 and files["outputs/b.bin"]["size"] == 1024
    assert "resources/read" not in json.dumps(res)
    # No files: no key.
    assert "files" not in lean_call(server, "pass")["structuredContent"]


def test_kept_output_is_one_copy(server):
    # 90 KB of output: the result is at most 1.25 times the output (it was twice, and more).
    # (MID-MARK is in the middle: in no beginning or end the text block shows.)
    script = "import sys\nsys.stdout.write('MARK-90K ' + 'y' * 45000 + 'MID-MARK' + 'y' * 44992 + '\\n')\n"
    res = lean_call(server, script)
    sc = res["structuredContent"]
    assert sc["stdout"].startswith("MARK-90K ") and len(sc["stdout"]) == 90010
    wire = json.dumps(res, separators=(",", ":"))
    assert wire.count("MID-MARK") == 1
    assert len(wire) <= 1.25 * 90010
    # The text block has its beginning and end, and says where the whole is, in the seed's frame.
    text = text_of(res)
    assert "--- stdout ---\nMARK-90K yyyy" in text
    assert "[all 90010 bytes: structuredContent.stdout]" in text and "yyyy\n" in text
    assert "--- exit_code: 0 ---" in text
    # A traceback after a flood: the end of stderr is in the text block.
    res = lean_call(server, "import sys\nsys.stderr.write('z' * 50000 + '\\n')\n1/0\n")
    assert "ZeroDivisionError: division by zero" in text_of(res)
    assert res["structuredContent"]["error"] == "exit code 1: ZeroDivisionError: division by zero"
    # A little output is in both: every host shows it, whichever part it reads.
    res = lean_call(server, "print('small')")
    assert "small" in text_of(res) and res["structuredContent"]["stdout"] == "small\n"


def test_100_mb_of_kept_output_is_one_copy_on_the_wire(make_server):
    # 60 MB on stdout and 40 MB on stderr, all kept: the response line holds each byte once.
    s = make_server("--max-output-bytes", str(64 << 20))
    s.initialize()
    # (the marks are in the middle: in no beginning or end the text block shows)
    script = ("import sys\n"
              "sys.stdout.write('o' * 30_000_000 + 'OUT-MARK' + 'o' * (30_000_000 - 8))\n"
              "sys.stderr.write('e' * 20_000_000 + 'ERR-MARK' + 'e' * (20_000_000 - 8))\n")
    s.send({"jsonrpc": "2.0", "id": 77, "method": "tools/call",
            "params": {"name": "execute_python", "arguments": {"script": script, "timeout_seconds": 120}}})
    while True:
        line = s.lines.get(timeout=180)
        assert line is not None, "server closed stdout"
        if b'"id":77' in line or b'"id": 77' in line:
            break
    assert line.count(b"OUT-MARK") == 1 and line.count(b"ERR-MARK") == 1
    assert len(line) <= 1.25 * 100_000_000, len(line)
    res = json.loads(line)["result"]
    sc = res["structuredContent"]
    assert len(sc["stdout"]) == 60_000_000 and len(sc["stderr"]) == 40_000_000
    assert sc["truncated"] is False
    # The text block: the beginning and end of each stream, not a copy.
    assert len(res["content"][0]["text"]) <= 40 * 1024


def test_output_up_to_16_kib_is_whole_in_the_seeds_text_block(server):
    """The seed's clients read the text block: a table or a report of a few KiB is there whole,
    as before, and in structuredContent too (hosts that show that one see it whole)."""
    script = "print('\\n'.join('row %04d ' % i + 'v' * 60 for i in range(200)))"
    res = lean_call(server, script)
    want = "\n".join("row %04d " % i + "v" * 60 for i in range(200)) + "\n"
    assert len(want) > 12000
    assert res["structuredContent"]["stdout"] == want
    assert text_of(res).startswith("--- stdout ---\n" + want + "\n--- exit_code: 0 ---")
