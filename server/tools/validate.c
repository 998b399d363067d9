/* validate_script: checks a script without running it, for real: the PEP 723 TOML, every
 * requirement string (PEP 508), requires-python against the interpreters this server has,
 * and the script's syntax as compiled by the interpreter that would run it. */
#include <errno.h>
#include <stdio.h>

#include "envstore/envstore.h"
#include "server/exec/exec.h"
#include "server/tools/tools-internal.h"

#define VALIDATE_TIMEOUT_MS 15000

static char compile_code[] =
    "import sys, json\n"
    "src = open(sys.argv[1], 'rb').read()\n"
    "try:\n"
    "    compile(src, 'script.py', 'exec', dont_inherit=True)\n"
    "except SyntaxError as e:\n"
    "    print(json.dumps({'type': type(e).__name__, 'msg': str(e.msg), 'lineno': e.lineno,"
    " 'offset': e.offset, 'text': (e.text or '').rstrip()}))\n"
    "except Exception as e:\n"
    "    print(json.dumps({'type': type(e).__name__, 'msg': str(e)[:500]}))\n";

typedef struct validate_call {
  srv_request_t *req;
  srv_server_t *server;
  srv_script_t script;
  char *source;
  size_t source_len;
  char *python_request;
  void *py_wait;
  py_interp_t *py;
  char *workdir;
  sbx_run_t *run;
  cm_buf_t out;
  bool resolve;
  void *resolve_wait;
  void *probe_wait; /* the resolution runs in the sandbox: after its probe */
  char *valid_text; /* the VALID answer, waiting for the resolution */
  json_t *valid_sc;
  char *principal; /* held against --max-token-concurrent (exec_hold) */
} validate_call_t;

static void call_free(validate_call_t *c) {
  if (c->principal) exec_release(srv_server_exec(c->server), c->principal);
  free(c->principal);
  if (c->workdir) {
    cm_error_t err = CM_ERROR_INIT;
    cm_rm_rf(c->workdir, &err);
    cm_error_release(&err);
  }
  srv_script_release(&c->script);
  free(c->source);
  free(c->python_request);
  free(c->workdir);
  cm_buf_release(&c->out);
  free(c->valid_text);
  json_decref(c->valid_sc);
  free(c);
}

static json_t *invalid_result(const char *message, json_t *warnings) {
  cleanup_free char *text = xasprintf("INVALID: %s", message);
  json_t *r = srv_tool_text_result(text, true);
  json_object_set_new(r, "structuredContent",
                      json_pack("{s:b, s:[s], s:o}", "valid", 0, "errors", message, "warnings",
                                warnings ? warnings : json_array()));
  return r;
}

static void finish(validate_call_t *c, json_t *result) {
  srv_request_t *r = c->req;
  call_free(c);
  srv_request_finish(r, result);
}

/* Warnings a model can act on: unpinned requirements, requirements a marker excludes. */
static json_t *collect_warnings(validate_call_t *c) {
  json_t *w = json_array();
  py_marker_env_t env;
  py_marker_env(c->py, &env);
  for (size_t i = 0; i < c->script.n_requirements; i++) {
    pep508_requirement_t *q = c->script.parsed[i];
    if (q->marker && !pep508_marker_evaluate(q->marker, &env.env)) {
      json_array_append_new(
          w, json_sprintf("%s: skipped on Python %s (its marker excludes this interpreter)",
                          c->script.requirements[i], c->py->version));
      continue;
    }
    if (!q->url && q->specifiers->len == 0)
      json_array_append_new(w,
                            json_sprintf("%s: no version constraint (any version may be installed)",
                                         q->normalized_name));
  }
  return w;
}

/* resolve: true: the dry run's outcome completes the answer. */
static void on_resolved(void *data, json_t *resolved, const cm_error_t *error) {
  validate_call_t *c = data;
  c->resolve_wait = NULL;
  if (srv_request_cancelled(c->req)) {
    finish(c, json_object());
    return;
  }
  if (!resolved) {
    cleanup_free char *msg =
        xasprintf("the dependencies cannot be resolved: %s", cm_error_message(error));
    json_t *w = json_incref(json_object_get(c->valid_sc, "warnings"));
    finish(c, invalid_result(msg, w));
    return;
  }
  cm_buf_t t;
  cm_buf_init(&t, 0);
  cm_buf_appends(&t, c->valid_text);
  cm_buf_printf(&t, "\nresolved (%zu):", json_object_size(resolved));
  const char *name;
  json_t *v;
  json_object_foreach(resolved, name, v)
      cm_buf_printf(&t, "\n  - %s==%s", name, json_string_value(v));
  cleanup_free char *text = cm_buf_steal(&t);
  json_object_set(c->valid_sc, "resolved", resolved);
  json_t *result = srv_tool_text_result(text, false);
  json_object_set(result, "structuredContent", c->valid_sc);
  finish(c, result);
}

/* The resolution runs in the sandbox, so only once the sandbox is probed (waiting for that
 * does not block the loop). */
static void start_resolve(void *data) {
  validate_call_t *c = data;
  c->probe_wait = NULL;
  if (!srv_server_probed(c->server)) {
    c->probe_wait = srv_server_when_probed(c->server, start_resolve, c);
    return;
  }
  const char *principal = srv_session_principal(srv_request_session(c->req));
  cm_error_t err = CM_ERROR_INIT;
  c->resolve_wait = env_store_resolve(
      srv_server_envs(c->server), c->py, c->script.requirements, c->script.n_requirements,
      principal ? principal : SRV_PRINCIPAL_STDIO, on_resolved, c, &err);
  if (!c->resolve_wait) {
    finish(c, srv_tool_error_result("The dependencies were not resolved: %s.",
                                    cm_error_message(&err)));
    cm_error_release(&err);
  }
}

static void on_compile_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  validate_call_t *c = data;
  if (stream == SBX_STDOUT) cm_buf_append(&c->out, buf, len);
}

static void on_compiled(void *data, const sbx_result_t *res) {
  validate_call_t *c = data;
  sbx_run_free(c->run);
  c->run = NULL;
  if (srv_request_cancelled(c->req)) {
    finish(c, json_object());
    return;
  }
  json_t *warnings = collect_warnings(c);
  cleanup_json json_t *verdict = c->out.len ? json_loadb(c->out.data, c->out.len, 0, NULL) : NULL;
  if (res->exit_code != 0 || res->timed_out) {
    cleanup_free char *msg =
        xasprintf("the syntax check with Python %s did not finish (exit code %d%s)", c->py->version,
                  res->exit_code, res->timed_out ? ", timed out" : "");
    finish(c, invalid_result(msg, warnings));
    return;
  }
  if (json_is_object(verdict)) {
    const char *type = json_string_value(json_object_get(verdict, "type"));
    const char *msg = json_string_value(json_object_get(verdict, "msg"));
    json_t *line = json_object_get(verdict, "lineno");
    json_t *off = json_object_get(verdict, "offset");
    const char *text = json_string_value(json_object_get(verdict, "text"));
    cleanup_free char *where =
        json_is_integer(line)
            ? (json_is_integer(off)
                   ? xasprintf(" (line %lld, column %lld)", (long long)json_integer_value(line),
                               (long long)json_integer_value(off))
                   : xasprintf(" (line %lld)", (long long)json_integer_value(line)))
            : xstrdup("");
    cleanup_free char *full =
        xasprintf("%s: %s%s%s%s with Python %s", type ? type : "Error", msg ? msg : "", where,
                  text && *text ? ": " : "", text && *text ? text : "", c->py->version);
    finish(c, invalid_result(full, warnings));
    return;
  }
  /* VALID, in the seed's format, then what the seed never said. */
  cm_buf_t t;
  cm_buf_init(&t, 0);
  cm_buf_appends(&t, "VALID");
  const char *rp = c->script.meta.requires_python;
  if (rp) cm_buf_printf(&t, "\nrequires-python: %s", rp);
  if (c->script.n_requirements == 0) {
    cm_buf_appends(&t, "\ndependencies: none");
  } else {
    cm_buf_printf(&t, "\ndependencies (%zu):", c->script.n_requirements);
    for (size_t i = 0; i < c->script.n_requirements; i++)
      cm_buf_printf(&t, "\n  - %s", c->script.requirements[i]);
  }
  cm_buf_printf(&t, "\npython: %s %s (%s)", c->py->implementation, c->py->version,
                c->py->executable);
  if (json_array_size(warnings)) {
    cm_buf_appends(&t, "\nwarnings:");
    size_t i;
    json_t *w;
    json_array_foreach(warnings, i, w) cm_buf_printf(&t, "\n  - %s", json_string_value(w));
  }
  json_t *deps = json_array();
  for (size_t i = 0; i < c->script.n_requirements; i++)
    json_array_append_new(deps, json_string(c->script.requirements[i]));
  cleanup_free char *text = cm_buf_steal(&t);
  json_t *sc = json_pack("{s:b, s:[], s:o, s:o, s:o, s:{s:s, s:s}}", "valid", 1, "errors",
                         "warnings", warnings, "dependencies", deps, "requires_python",
                         rp ? json_string(rp) : json_null(), "python", "version", c->py->version,
                         "path", c->py->executable);
  if (c->resolve && c->script.n_requirements > 0) {
    c->valid_text = steal_pointer(&text);
    c->valid_sc = sc;
    start_resolve(c);
    return;
  }
  json_t *result = srv_tool_text_result(text, false);
  json_object_set_new(result, "structuredContent", sc);
  finish(c, result);
}

static void on_cancel(void *data) {
  validate_call_t *c = data;
  if (c->probe_wait) {
    srv_server_cancel_probe_wait(c->server, c->probe_wait);
    c->probe_wait = NULL;
    finish(c, json_object());
    return;
  }
  if (c->resolve_wait) {
    env_store_cancel_resolve(srv_server_envs(c->server), c->resolve_wait);
    c->resolve_wait = NULL;
    finish(c, json_object());
    return;
  }
  if (c->run) {
    sbx_run_cancel(c->run);
    return;
  }
  if (c->py_wait) py_registry_cancel_wait(srv_server_pythons(c->server), c->py_wait);
  finish(c, json_object());
}

static void on_python(void *data, py_interp_t *def, const cm_error_t *def_error) {
  validate_call_t *c = data;
  c->py_wait = NULL;
  cleanup_error cm_error_t why = CM_ERROR_INIT;
  c->py = py_registry_select(srv_server_pythons(c->server), c->python_request,
                             c->script.meta.requires_python, &why);
  if (!c->py) {
    finish(c, invalid_result(why.msg ? why.msg : "no interpreter", NULL));
    return;
  }
  cm_error_t err = CM_ERROR_INIT;
  c->workdir = xasprintf("%s/validate-XXXXXX", srv_server_runs_dir(c->server));
  cleanup_free char *path = NULL;
  if (!mkdtemp(c->workdir)) {
    free(c->workdir);
    c->workdir = NULL;
    finish(c, srv_tool_error_result("Cannot prepare the syntax check: %s", strerror(errno)));
    return;
  }
  path = xasprintf("%s/script.py", c->workdir);
  if (cm_write_file(path, c->source, c->source_len, 0644, &err) < 0) {
    finish(c, srv_tool_error_result("Cannot prepare the syntax check: %s", cm_error_message(&err)));
    cm_error_release(&err);
    return;
  }
  /* compile() never runs the script, so the host runs it with tight limits. */
  char *argv[] = {c->py->executable, "-I", "-S", "-c", compile_code, "script.py", NULL};
  char *envp[] = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8", NULL};
  sbx_spec_t spec = {
      .argv = argv,
      .envp = envp,
      .workdir = c->workdir,
      .limits = {.timeout_ms = VALIDATE_TIMEOUT_MS,
                 .grace_ms = 500,
                 .memory_bytes = 1ull << 30,
                 .max_processes = 0,
                 .file_size_bytes = 1 << 20},
  };
  sbx_run_callbacks_t cbs = {.on_output = on_compile_output, .on_exit = on_compiled};
  if (sbx_run_start(srv_server_loop(c->server), srv_server_host_backend(c->server), &spec, &cbs, c,
                    &c->run, &err) < 0) {
    finish(c, srv_tool_error_result("Cannot run the syntax check: %s", cm_error_message(&err)));
    cm_error_release(&err);
  }
}

static const char *const known_args[] = {"script", "dependencies", "python_version", "resolve"};

void srv_tool_validate_script(srv_request_t *r, json_t *args) {
  srv_server_t *s = srv_request_server(r);
  const srv_config_t *cfg = srv_server_config(s);
  const char *key;
  json_t *value;
  json_object_foreach(args, key, value) {
    bool known = false;
    for (size_t i = 0; i < CM_ARRAY_SIZE(known_args); i++) known |= strcmp(key, known_args[i]) == 0;
    if (!known) {
      cleanup_free char *k = cm_log_excerpt(key, strlen(key), 40);
      srv_request_finish(r, srv_tool_error_result("Unknown argument '%s'. validate_script accepts: "
                                                  "script, dependencies, python_version, resolve.",
                                                  k));
      return;
    }
  }
  json_t *script = json_object_get(args, "script");
  if (!json_is_string(script)) {
    srv_request_finish(
        r, srv_tool_error_result("'script' is required and must be a string of Python code."));
    return;
  }
  if (json_string_length(script) > cfg->max_script_bytes) {
    srv_request_finish(r, srv_tool_error_result("The script is %zu bytes; the limit is %llu bytes.",
                                                json_string_length(script),
                                                (unsigned long long)cfg->max_script_bytes));
    return;
  }
  json_t *deps = json_object_get(args, "dependencies");
  if (deps && !json_is_null(deps) && !json_is_array(deps)) {
    srv_request_finish(
        r, invalid_result("'dependencies' must be a list of requirement strings", NULL));
    return;
  }
  json_t *pv = json_object_get(args, "python_version");
  if (pv && !json_is_null(pv) &&
      (!json_is_string(pv) || json_string_length(pv) == 0 || json_string_length(pv) > 200)) {
    srv_request_finish(
        r, srv_tool_error_result("'python_version' must be a version string such as \"3.12\"."));
    return;
  }
  json_t *resolve = json_object_get(args, "resolve");
  if (resolve && !json_is_boolean(resolve) && !json_is_null(resolve)) {
    srv_request_finish(r, srv_tool_error_result("'resolve' must be true or false."));
    return;
  }
  validate_call_t *c = xcalloc(1, sizeof *c);
  c->resolve = json_is_true(resolve);
  c->req = r;
  c->server = s;
  cm_buf_init(&c->out, 65536);
  c->source_len = json_string_length(script);
  c->source = xstrndup(json_string_value(script), c->source_len);
  c->python_request = json_is_string(pv) ? xstrdup(json_string_value(pv)) : NULL;
  cm_error_t err = CM_ERROR_INIT;
  if (srv_script_prepare(c->source, c->source_len, deps, &c->script, &err) < 0) {
    json_t *res = invalid_result(cm_error_message(&err), NULL);
    cm_error_release(&err);
    finish(c, res);
    return;
  }
  /* It runs a process (and maybe a resolution): one principal may not have more of those
   * at once than --max-token-concurrent lets it have executions. */
  srv_session_t *session = srv_request_session(r);
  const char *principal = session ? srv_session_principal(session) : SRV_PRINCIPAL_STDIO;
  if (!exec_hold(srv_server_exec(s), principal)) {
    json_t *res = srv_tool_error_result(
        "The token '%s' already has %llu calls running or waiting across its sessions (the "
        "server's "
        "per-token limit, --max-token-concurrent). Wait for one to finish and call again.",
        principal, (unsigned long long)cfg->max_token_concurrent);
    finish(c, res);
    return;
  }
  c->principal = xstrdup(principal);
  srv_request_on_cancel(r, on_cancel, c);
  c->py_wait = py_registry_when_ready(srv_server_pythons(s), on_python, c);
}

json_t *srv_tool_validate_script_describe(srv_server_t *s) {
  (void)s;
  json_t *input = json_pack("{s:s, s:{s:{s:s}, s:{s:s, s:{s:s}}, s:{s:s}, s:{s:s}}, s:[s]}", "type",
                            "object", "properties", "script", "type", "string", "dependencies",
                            "type", "array", "items", "type", "string", "python_version", "type",
                            "string", "resolve", "type", "boolean", "required", "script");
  return json_pack("{s:s, s:s, s:s, s:o, s:{s:b}}", "name", "validate_script", "title",
                   "Check a script", "description",
                   "Checks a script without running it: PEP 723 block, dependencies (resolve: true "
                   "lists the versions), syntax.",
                   "inputSchema", input, "annotations", "readOnlyHint", 1);
}
