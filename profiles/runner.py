"""The start-up runner of mcp-python-exec-sandbox: `python -s runner.py script.py [args]`,
or `python -s runner.py script.py --mps-warm FIFO` for a prestarted interpreter (below).

The server starts every script through this file (mounted read-only at /opt/mps in the
sandbox; its host path with the none backend) instead of `python -s script.py`, so that
figures a script leaves open are returned.  It must stay invisible otherwise:

- the script runs as `__main__` in a fresh module namespace with the same globals Python
  gives a script (`__file__` absolute on 3.9+, `__loader__`, `__spec__` None, ...),
  `sys.argv[0] == 'script.py'` and `sys.path[0]` the script's directory;
- tracebacks show only the script's frames with its true line numbers, and a syntax error
  is reported as Python reports one; exit codes and `SystemExit` behave as usual;
- nothing is imported that the interpreter has not already imported at start-up; the
  figure hook looks only at `sys.modules`, so a script that never imports matplotlib pays
  nothing for it.

A prestarted interpreter (--prestart) is started with `script.py --mps-warm FIFO` before
the call exists: it initialises (site, the environment's paths, this file) and blocks on
FIFO, which the server writes the go into once the call's files and script are in the work
directory.  Nothing is imported for the wait (os is the interpreter's own), so the script
finds the same sys.modules as in a run started for it.

When the script has imported `matplotlib.pyplot`, every figure still open when it ends
(normally, with `sys.exit()` or with an uncaught exception) is saved to
`outputs/figure-N.png` in the directory the script started in (a free name is chosen when
one is taken).  It runs before the interpreter's atexit handlers, because pyplot registers
one that closes every figure.  The server sets MPLBACKEND=Agg, so nothing tries to open a
window.
"""
_MPS_INITIAL_GLOBALS = list(globals())

import sys


def _mps_save_open_figures(outputs_dir):
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    import os

    try:
        numbers = list(pyplot.get_fignums())
    except Exception as exc:  # a broken or partial pyplot: say so, never fail the run
        sys.stderr.write("mcp-python-exec-sandbox: cannot list open figures: %r\n" % (exc,))
        return
    if not numbers:
        return
    try:
        os.makedirs(outputs_dir, exist_ok=True)
    except OSError as exc:
        sys.stderr.write("mcp-python-exec-sandbox: cannot create %s: %s\n" % (outputs_dir, exc))
        return
    for number in numbers:
        stem = "figure-%s" % (number,)
        path = os.path.join(outputs_dir, stem + ".png")
        n = 2
        while os.path.lexists(path):
            path = os.path.join(outputs_dir, "%s-%d.png" % (stem, n))
            n += 1
        try:
            pyplot.figure(number)
            pyplot.savefig(path)
        except Exception as exc:
            sys.stderr.write("mcp-python-exec-sandbox: cannot save figure %s: %r\n" % (number, exc))


def _mps_read(os, fd, n):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _mps_wait_go(os, path):
    """Blocks on the server's FIFO until the call's go: one frame (a 4-byte big-endian
    length, then a JSON object, as the session kernel's) {"op": "run", "script": NAME}.
    Parsed by hand, so that nothing is imported for it: the server writes a flat object
    of plain strings.  End of file: the sandbox is not needed; it ends without running
    anything."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        head = _mps_read(os, fd, 4)
        n = int.from_bytes(head, "big") if head is not None else 0
        body = _mps_read(os, fd, n) if 0 < n <= 4096 else None
    finally:
        os.close(fd)
    if body is None:
        os._exit(0)
    fields = {}
    for part in body.decode("utf-8").strip().lstrip("{").rstrip("}").split(","):
        key, _, value = part.partition(":")
        fields[key.strip().strip('"')] = value.strip().strip('"')
    if fields.get("op") != "run" or not fields.get("script"):
        sys.stderr.write("mcp-python-exec-sandbox: a go the runner cannot read\n")
        os._exit(126)
    return fields["script"]


def _mps_watch_writes():
    """From 3.8 on: an audit hook (the runner's only trace in the script's run; hooks are
    not traced or profiled) that notes a file opened for writing through Python's io, or
    a database connection, whose unwritten buffers only finalisation would flush.  None
    before 3.8: every run then ends through the interpreter's finalisation."""
    if not hasattr(sys, "addaudithook"):
        return None
    seen = []

    def _mps_audit(event, args):
        if seen:
            return
        if event == "open":
            mode = args[1]
            if mode.__class__ is str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode):
                seen.append("file")
        elif event == "sqlite3.connect":
            seen.append("database")

    sys.addaudithook(_mps_audit)
    return seen


def _mps_std_streams():
    ids = set()
    for name in ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__"):
        stream = getattr(sys, name, None)
        for _ in range(3):  # the text layer, its buffer, its raw file
            if stream is None:
                break
            ids.add(id(stream))
            stream = getattr(stream, "buffer", None) or getattr(stream, "raw", None)
    return ids


def _mps_needs_finalisation(namespace, watch):
    """Whether skipping the interpreter's finalisation could lose what the script wrote:
    a file opened for writing (through io) and still open, a database connection, or a
    value of the script's namespace whose type has a finaliser (an object with __del__,
    a class defining one, a generator).  Conservative: any doubt is a yes."""
    if watch.count("database"):
        return True
    std = _mps_std_streams()
    try:
        for value in list(namespace.values()):
            if id(value) in std:
                continue
            kind = value if isinstance(value, type) else type(value)
            if getattr(kind, "__del__", None) is not None:
                return True
        if not watch:
            return False
        import gc

        base = sys.modules["_io"]._IOBase
        for obj in gc.get_objects():
            if isinstance(obj, base) and id(obj) not in std and not obj.closed and obj.writable():
                return True
    except BaseException:
        return True
    return False


def _mps_exit(os, code, namespace, watch):
    """Ends the process as the interpreter would, without its finalisation (freeing every
    module and object costs a few milliseconds a call): joins the non-daemon threads, runs
    the atexit handlers, flushes stdout and stderr, then os._exit with the status
    `python script.py` would have had.  Returns (the code to raise SystemExit with) only
    when the normal way must be taken: the code is not one the fast way can give, a flush
    failed, or _mps_needs_finalisation says so; what already ran does not run twice."""
    if watch is None:
        return code  # before 3.8: no audit hook to tell what finalisation would flush
    if code is None:
        status = 0
    elif isinstance(code, int):
        if not -(2**31) <= code < 2**31:
            return code
        status = int(code)
    else:
        # What the interpreter does with sys.exit("message"): print it, status 1.
        try:
            err = sys.stderr
            if err is None:
                return code
            err.write(str(code))
            err.write("\n")
        except BaseException:
            return code
        code = status = 1
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit

        try:
            atexit._run_exitfuncs()
        except BaseException:
            pass  # the interpreter ignores what the handlers raise (each was reported)
        # The current streams, then the ones they replaced (flushed when freed).
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            if stream is not None and not stream.closed:
                stream.flush()
        if _mps_needs_finalisation(namespace, watch):
            return code
    except BaseException:
        return code
    os._exit(status)


def _mps_run():
    import os

    if len(sys.argv) == 4 and sys.argv[2] == "--mps-warm":
        # A prestarted interpreter (--prestart): up to here only the interpreter's own
        # start-up has run; the call's files and script are written before the go.
        sys.argv[1:] = [_mps_wait_go(os, sys.argv[3])]
    script = sys.argv[1]
    start_dir = os.getcwd()
    outputs_dir = os.path.join(start_dir, "outputs")
    # What `python script.py` would have set.
    shown_path = os.path.abspath(script) if sys.version_info >= (3, 9) else script
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.realpath(script))

    main = type(sys)("__main__")
    bootstrap = sys.modules.get("_frozen_importlib_external")
    loader = None
    if bootstrap is not None and hasattr(bootstrap, "SourceFileLoader"):
        loader = bootstrap.SourceFileLoader("__main__", shown_path)
    values = {
        "__name__": "__main__",
        "__doc__": None,
        "__package__": None,
        "__loader__": loader,
        "__spec__": None,
        "__annotations__": {},
        "__builtins__": __builtins__,
        "__file__": shown_path,
        "__cached__": None,
    }
    namespace = main.__dict__
    for key in _MPS_INITIAL_GLOBALS:
        if key in values:
            namespace[key] = values[key]
    for key in ("__file__", "__cached__", "__builtins__"):
        namespace.setdefault(key, values[key])
    sys.modules["__main__"] = main

    with open(script, "rb") as f:
        source = f.read()
    code = None
    watch = _mps_watch_writes()
    try:
        code = compile(source, shown_path, "exec", dont_inherit=True)
        del source
        exec(code, namespace)
    except SystemExit as exc:
        _mps_save_open_figures(outputs_dir)
        raise SystemExit(_mps_exit(os, exc.code, namespace, watch))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        _mps_save_open_figures(outputs_dir)
        # Report it as the interpreter would, without this runner's frames.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code is not code:
            tb = tb.tb_next
        if isinstance(exc, SyntaxError) and code is None:
            tb = None
        # The default hook prints the exception's own __traceback__, not its argument.
        exc.__traceback__ = tb
        sys.excepthook(type(exc), exc, tb)
        del exc, tb
        _mps_exit(os, 1, namespace, watch)
        raise SystemExit(1)
    _mps_save_open_figures(outputs_dir)
    _mps_exit(os, None, namespace, watch)


_mps_run()
