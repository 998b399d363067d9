"""validate_script (the seed's VALID / INVALID format, validating for real) and PEP 723
metadata in execute_python."""
import pytest


def text(res):
    return res["content"][0]["text"]


def validate(server, script, **kw):
    return server.call("validate_script", {"script": script, **kw})


def test_seed_cases(server):
    res = validate(server, "import pandas", dependencies=["pandas>=2.0", "numpy"])
    t = text(res)
    assert t.startswith("VALID") and "pandas>=2.0" in t and "numpy" in t
    assert "dependencies (2):\n  - pandas>=2.0\n  - numpy" in t
    assert res["structuredContent"]["valid"] is True
    res = validate(server, "print('hello')")
    assert text(res).startswith("VALID\ndependencies: none")
    block = '# /// script\n# requires-python = ">=3.11"\n# dependencies = ["requests"]\n# ///\nimport requests\n'
    t = text(validate(server, block))
    assert t.startswith("VALID\nrequires-python: >=3.11\ndependencies (1):\n  - requests")


def test_merge_rule(server):
    block = '# /// script\n# dependencies = ["requests>=2.28", "Requests_X"]\n# ///\n'
    res = validate(server, block, dependencies=["requests>=2.30"])
    assert res["structuredContent"]["dependencies"] == ["requests>=2.30", "Requests_X"]


@pytest.mark.parametrize("script,deps,needle", [
    ("# /// script\n# this is not valid toml [[[\n# ///\n", None, "line"),
    ("print(1)", ["not a valid dep!!!"], "not a valid dep"),
    ("print(1)", ["foo>="], "foo>="),
    ("# /// script\n# dependencies = \"requests\"\n# ///\n", None, "dependencies"),
    ("# /// script\n# requires-python = \">=3.99\"\n# ///\n", None, "requires-python"),
    ("# /// script\n# requires-python = \"banana\"\n# ///\n", None, "requires-python"),
    ("# /// script\n# ///\n# /// script\n# ///\n", None, "script"),
    ("x = 1\n# /// script\n# dependencies = []\n", None, "line 2"),
    ("x = 1\ny = (\nprint(2)\n", None, "SyntaxError"),
    ("def f(:\n  pass\n", None, "line 1"),
])
def test_invalid(server, script, deps, needle):
    res = validate(server, script, **({"dependencies": deps} if deps is not None else {}))
    t = text(res)
    assert t.startswith("INVALID: "), t
    assert needle in t, t
    assert res["isError"] is True
    assert res["structuredContent"]["valid"] is False


def test_requires_python_unsatisfiable_lists_available(server):
    t = text(validate(server, "# /// script\n# requires-python = \">=3.99\"\n# ///\n"))
    assert "Available:" in t


def test_warnings(server):
    res = validate(server, "pass", dependencies=["numpy", "oldthing==1.0; python_version < '3.0'", "pinned==1.2"])
    t = text(res)
    assert t.startswith("VALID")
    assert "warnings:" in t
    warnings = res["structuredContent"]["warnings"]
    assert any(w.startswith("numpy: no version constraint") for w in warnings)
    assert any("oldthing" in w and "skipped" in w for w in warnings)
    assert not any(w.startswith("pinned") for w in warnings)


def test_crlf_block(server):
    s = "# /// script\r\n# requires-python = \">=3.8\"\r\n# ///\r\nprint(1)\r\n"
    assert text(validate(server, s)).startswith("VALID\nrequires-python: >=3.8")


def test_python_version_for_syntax(server):
    # The walrus operator is a syntax error before 3.8; match statements before 3.10.
    script = "match 1:\n    case 1:\n        pass\n"
    res = validate(server, script, python_version="3.9")
    if "No Python interpreter matches" in text(res):
        pytest.skip("no 3.9 here")
    assert text(res).startswith("INVALID: SyntaxError")
    assert text(validate(server, script, python_version="3.12")).startswith("VALID")


def test_execute_honours_requires_python(server):
    script = '# /// script\n# requires-python = "<3.10"\n# ///\nimport sys\nprint(sys.version_info[:2])\n'
    res = server.execute(script)
    if res["isError"] and "satisfies" in text(res):
        pytest.skip("no interpreter older than 3.10 here")
    out = res["structuredContent"]["stdout"].strip()
    assert out.startswith("(3, ") and int(out[4:].split(")")[0]) < 10


def test_execute_keeps_line_numbers_with_a_block(server):
    script = '# /// script\n# requires-python = ">=3.8"\n# dependencies = []\n# ///\n\nraise RuntimeError("here")\n'
    res = server.execute(script)
    assert 'line 6' in res["structuredContent"]["stderr"]


def test_execute_rejects_bad_metadata(server):
    res = server.execute("# /// script\n# dependencies = [1]\n# ///\nprint(1)")
    assert res["isError"] is True and "metadata" in text(res)
    res = server.execute("# /// script\n# requires-python = \">=3.99\"\n# ///\nprint(1)")
    assert res["isError"] is True and "requires-python" in text(res)


def test_execute_python_version_conflicting_with_requires_python(server):
    res = server.execute("# /// script\n# requires-python = \">=3.12\"\n# ///\nprint(1)", python_version="3.11")
    assert res["isError"] is True and "does not satisfy" in text(res)


def test_nul_in_a_script_is_refused_at_the_protocol_level(server):
    # JSON strings with U+0000 are refused before any tool sees them (no C string surprises).
    server.send_raw(b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"validate_script",'
                    b'"arguments":{"script":"x = 1\\u0000"}}}\n')
    r = server.recv()
    assert r["error"]["code"] == -32700
    assert server.request("ping")["result"] == {}
