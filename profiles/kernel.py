"""The session kernel of mcp-python-exec-sandbox: `python -s kernel.py CONTROL_DIR`.

A session (execute_python's `session` argument) runs its calls in this one long-lived
interpreter, started in a sandbox of its own (mounted read-only at /opt/mps, like the start-up
runner; its host path with the none backend).  The server talks to it through two FIFOs in
CONTROL_DIR (read-only for the sandbox): `req`, which the kernel reads, and `res`, which it
writes.  Both carry frames: a 4-byte big-endian length, then that many bytes of one JSON
object.  Requests:

- {"op": "run", "id": N, "code": TEXT, "filename": NAME, "export": BOOL}: run TEXT in the
  session's namespace, compiled as NAME so tracebacks name its lines; with export, then write
  the work directory (less outputs/) as outputs/workspace.tar.  A script too long for one
  request comes as "code_file": PATH instead of "code" (a file the server wrote in
  CONTROL_DIR);
- {"op": "interrupt", "id": N}: raise KeyboardInterrupt in call N if it is still running.

After each run the kernel answers {"id": N, "status": "ok"|"error"|"interrupted"|"exit",
"exit_code": N, "error": NAME|null, "display": TEXT|null, "rss_bytes": N}, and with
export "export_error": TEXT when the archive could not be written (then there is none), after flushing its
stdout and stderr (which go to the server as the call's output).  Everything it says is
treated by the server as hostile: it runs the user's code.

What a call sees: the namespace of `__main__` persists (names, imports, open files, threads);
the value of a final expression is printed as a REPL prints it (and kept as `_`); outputs/ is
emptied before each call and whatever is left there comes back; matplotlib figures still open
when a call ends are saved as outputs/figure-N.png and closed.  The kernel's own imports (os,
sys, json, struct, signal, select, fcntl, ast, linecache) are in sys.modules from the start.

The kernel has one thread: the user's code may fork as in a plain interpreter.  Between calls
it waits for requests itself; during a call the request FIFO signals (SIGIO, O_ASYNC) and the
handler reads what came: an interrupt for the running call raises SIGINT in the kernel, so
that a SIGINT handler of the user's runs as it would for Ctrl-C.
"""
import ast
import fcntl
import json
import linecache
import os
import select
import signal
import struct
import sys

_MAX_FRAME = 1 << 20
_MAX_DISPLAY = 4096


class _State:
    running_id = None  # the call that KeyboardInterrupt may stop, or None


class _Requests:
    """The request FIFO (non-blocking): bytes read so far, the frames in them."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = b""
        self.broken = False  # a frame over the size limit: the server is gone or mad
        self.runs = []  # run requests read and not yet run

    def take(self):
        """Reads what is there, and acts on the complete frames: runs are kept, an interrupt
        of the running call is raised."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                break
            self.buf += chunk
            if len(self.buf) > 4 + _MAX_FRAME:
                break
        while len(self.buf) >= 4 and not self.broken:
            (n,) = struct.unpack(">I", self.buf[:4])
            if n > _MAX_FRAME:
                self.broken = True
                self.buf = b""
                break
            if len(self.buf) < 4 + n:
                break
            body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
            try:
                msg = json.loads(body.decode("utf-8"))
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if msg.get("op") == "interrupt":
                if msg.get("id") is not None and msg.get("id") == _State.running_id:
                    signal.raise_signal(signal.SIGINT)
            elif msg.get("op") == "run":
                self.runs.append(msg)


_requests = None


def _on_sigio(signum, frame):
    # Only during a call: between calls the main loop reads the FIFO itself.
    if _State.running_id is not None and _requests is not None:
        _requests.take()


def _on_sigint(signum, frame):
    # Only a running call may be interrupted: never the kernel between calls.
    if _State.running_id is not None:
        raise KeyboardInterrupt


def _write_frame(fd, obj):
    body = json.dumps(obj).encode("utf-8")
    data = struct.pack(">I", len(body)) + body
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _empty_outputs(outputs_dir):
    if os.path.islink(outputs_dir) or os.path.isfile(outputs_dir):
        os.unlink(outputs_dir)
    elif os.path.isdir(outputs_dir):
        import shutil

        shutil.rmtree(outputs_dir, ignore_errors=True)


def _save_open_figures(outputs_dir):
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        numbers = list(pyplot.get_fignums())
    except Exception as exc:
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
            pyplot.close(number)  # per call: the next call does not get it again
        except Exception as exc:
            sys.stderr.write("mcp-python-exec-sandbox: cannot save figure %s: %r\n" % (number, exc))


def _export(workdir, outputs_dir):
    import tarfile

    os.makedirs(outputs_dir, exist_ok=True)
    target = os.path.join(outputs_dir, "workspace.tar")
    try:
        with tarfile.open(target, "w") as tar:
            for name in sorted(os.listdir(workdir)):
                if name == "outputs":
                    continue
                tar.add(os.path.join(workdir, name), arcname=name, recursive=True)
    except BaseException:
        # Half an archive would pass for the workspace: none, and the server is told.
        try:
            os.unlink(target)
        except OSError:
            pass
        raise


def _report(exc, codes):
    # As the interpreter would, without the kernel's frames (the ones above the call's code,
    # and the SIGINT handler's at the end of an interrupted one).
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code not in codes:
        tb = tb.tb_next
    kept = []
    t = tb
    hidden = (_on_sigint.__code__, _on_sigio.__code__, _Requests.take.__code__)
    while t is not None:
        if t.tb_frame.f_code not in hidden:
            kept.append(t)
        t = t.tb_next
    for a, b in zip(kept, kept[1:] + [None]):
        a.tb_next = b
    tb = kept[0] if kept else None
    exc.__traceback__ = tb
    sys.excepthook(type(exc), exc, tb)


def _run(msg, namespace, workdir):
    call_id = msg.get("id")
    filename = str(msg.get("filename") or "<session>")
    outputs_dir = os.path.join(workdir, "outputs")
    reply = {"id": call_id, "status": "ok", "exit_code": 0, "error": None, "display": None}
    try:
        _empty_outputs(outputs_dir)
    except OSError as exc:
        sys.stderr.write("mcp-python-exec-sandbox: cannot empty outputs/: %s\n" % (exc,))
    codes = []
    try:
        code = msg.get("code")
        if isinstance(code, str):
            source = code.encode("utf-8", "surrogatepass")
        else:
            with open(str(msg.get("code_file")), "rb") as f:
                source = f.read()
        text = source.decode("utf-8", "replace")
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compile(ast.Expression(tree.body.pop().value), filename, "eval", dont_inherit=True)
        body = compile(tree, filename, "exec", dont_inherit=True)
        codes = [body] + ([last] if last is not None else [])
    except (SyntaxError, ValueError, OSError) as exc:
        sys.excepthook(type(exc), exc, None)
        reply.update(status="error", exit_code=1, error=type(exc).__name__)
        codes = None
    if codes is not None:
        try:
            _State.running_id = call_id
            try:
                exec(codes[0], namespace)
                value = eval(codes[1], namespace) if len(codes) > 1 else None
            finally:
                _State.running_id = None
            if value is not None:
                namespace["_"] = value
                shown = repr(value)
                print(shown)
                reply["display"] = shown[:_MAX_DISPLAY]
        except SystemExit as exc:
            code = exc.code
            reply["status"] = "exit"
            if code is None:
                reply["exit_code"] = 0
            elif isinstance(code, int):
                reply["exit_code"] = code & 0xFF if code >= 0 else 1
            else:
                sys.stderr.write("%s\n" % (code,))
                reply["exit_code"] = 1
        except KeyboardInterrupt as exc:
            _report(exc, codes)
            reply.update(status="interrupted", exit_code=1, error="KeyboardInterrupt")
        except BaseException as exc:
            _report(exc, codes)
            reply.update(status="error", exit_code=1, error=type(exc).__name__)
            del exc
    try:
        _save_open_figures(outputs_dir)
    except BaseException as exc:
        sys.stderr.write("mcp-python-exec-sandbox: %r\n" % (exc,))
    if msg.get("export"):
        try:
            _export(workdir, outputs_dir)
        except BaseException as exc:
            sys.stderr.write("mcp-python-exec-sandbox: the export failed: %r\n" % (exc,))
            reply["export_error"] = ("%s: %s" % (type(exc).__name__, exc))[:200]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    reply["rss_bytes"] = _rss_bytes()
    return reply


def _main():
    global _requests
    control = sys.argv[1]
    workdir = os.getcwd()
    req = os.open(os.path.join(control, "req"), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    res = os.open(os.path.join(control, "res"), os.O_WRONLY | os.O_CLOEXEC)
    main = type(sys)("__main__")
    namespace = main.__dict__
    namespace.update({"__name__": "__main__", "__doc__": None, "__package__": None,
                      "__loader__": None, "__spec__": None, "__builtins__": __builtins__})
    sys.modules["__main__"] = main
    sys.argv = [""]
    sys.path[0] = workdir
    signal.signal(signal.SIGINT, _on_sigint)
    _requests = _Requests(req)
    signal.signal(signal.SIGIO, _on_sigio)
    fcntl.fcntl(req, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(req, fcntl.F_SETFL, fcntl.fcntl(req, fcntl.F_GETFL) | os.O_ASYNC)
    while True:
        while not _requests.runs:
            if _requests.broken:
                os._exit(0)
            select.select([req], [], [])
            _requests.take()
        msg = _requests.runs.pop(0)
        _write_frame(res, _run(msg, namespace, workdir))
    os._exit(0)


_main()
