/* execute_python: its arguments become a run spec (server/exec/), which the execution
 * state runs; and the tool's description. */
#include <stdio.h>

#include "server/exec/exec.h"
#include "server/tools/tools-internal.h"

#define EXEC_MAX_DEPENDENCIES 256

static const char *const known_args[] = {"script",         "dependencies", "timeout_seconds",
                                         "python_version", "files",        "network",
                                         "session",        "export"};

void srv_tool_execute_python(srv_request_t *r, json_t *args) {
  srv_server_t *s = srv_request_server(r);
  const srv_config_t *cfg = srv_server_config(s);
  const char *key;
  json_t *value;
  json_object_foreach(args, key, value) {
    bool known = false;
    for (size_t i = 0; i < CM_ARRAY_SIZE(known_args); i++) known |= strcmp(key, known_args[i]) == 0;
    if (!known) {
      cleanup_free char *k = cm_log_excerpt(key, strlen(key), 40);
      srv_request_finish(r, srv_tool_error_result("Unknown argument '%s'. execute_python accepts: "
                                                  "script, dependencies, timeout_seconds, "
                                                  "python_version, files, network, session, "
                                                  "export.",
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
  cleanup_exec_spec exec_spec_t spec = {0};
  cleanup_free char *net_error = NULL;
  if (srv_network_parse_call(srv_server_network(s), cfg, srv_server_backend_kind(s),
                             json_object_get(args, "network"), &spec.net, &net_error) < 0) {
    srv_request_finish(r, srv_tool_error_result("%s", net_error));
    return;
  }
  json_t *deps = json_object_get(args, "dependencies");
  if (deps && !json_is_null(deps)) {
    if (!json_is_array(deps)) {
      srv_request_finish(r, srv_tool_error_result(
                                "'dependencies' must be a list of requirement strings or null."));
      return;
    }
    if (json_array_size(deps) > EXEC_MAX_DEPENDENCIES) {
      srv_request_finish(
          r, srv_tool_error_result("At most %d dependencies are accepted.", EXEC_MAX_DEPENDENCIES));
      return;
    }
  }
  /* The PEP 723 block is read, never rewritten: line numbers in tracebacks stay true. */
  srv_script_t prepared;
  cm_error_t perr = CM_ERROR_INIT;
  if (srv_script_prepare(json_string_value(script), json_string_length(script), deps, &prepared,
                         &perr) < 0) {
    srv_request_finish(r, srv_tool_error_result("Invalid script metadata or dependencies: %s",
                                                cm_error_message(&perr)));
    cm_error_release(&perr);
    return;
  }
  const toml_value_t *tool_uv = toml_table_get(prepared.meta.tool, "uv");
  spec.uv_config = toml_type(tool_uv) == TOML_TABLE ? toml_write(tool_uv) : NULL;
  spec.requirements = steal_pointer(&prepared.requirements);
  spec.n_requirements = prepared.n_requirements;
  spec.requires_python =
      prepared.meta.requires_python ? xstrdup(prepared.meta.requires_python) : NULL;
  srv_script_release(&prepared);
  json_t *t = json_object_get(args, "timeout_seconds");
  uint64_t timeout = 0; /* the server's default */
  if (t && !json_is_null(t)) {
    if (!json_is_integer(t) &&
        !(json_is_real(t) && json_real_value(t) == (double)(json_int_t)json_real_value(t))) {
      srv_request_finish(
          r, srv_tool_error_result("'timeout_seconds' must be an integer number of seconds."));
      return;
    }
    json_int_t v = json_is_integer(t) ? json_integer_value(t) : (json_int_t)json_real_value(t);
    if (v < 1) {
      srv_request_finish(r, srv_tool_error_result(
                                "'timeout_seconds' must be at least 1 (got %lld).", (long long)v));
      return;
    }
    timeout = (uint64_t)v;
  }
  exec_spec_set_timeout(&spec, cfg, timeout);
  json_t *pv = json_object_get(args, "python_version");
  if (pv && !json_is_null(pv) &&
      (!json_is_string(pv) || json_string_length(pv) == 0 || json_string_length(pv) > 200)) {
    srv_request_finish(r, srv_tool_error_result("'python_version' must be a version string such as "
                                                "\"3.12\", \"3.13t\" or \">=3.11,<3.13\"."));
    return;
  }
  spec.python_request = json_is_string(pv) ? xstrdup(json_string_value(pv)) : NULL;
  cm_error_t ferr = CM_ERROR_INIT;
  if (files_inputs_parse(json_object_get(args, "files"), cfg, &spec.inputs, &ferr) < 0) {
    srv_request_finish(r, srv_tool_error_result("%s", cm_error_message(&ferr)));
    cm_error_release(&ferr);
    return;
  }
  json_t *ses = json_object_get(args, "session");
  if (ses && !json_is_null(ses)) {
    if (!json_is_string(ses) || json_string_length(ses) == 0 || json_string_length(ses) > 64) {
      srv_request_finish(r, srv_tool_error_result("'session' must be \"new\" (to start a session) "
                                                  "or the id of one of your sessions."));
      return;
    }
    spec.session = xstrdup(json_string_value(ses));
  }
  json_t *exp = json_object_get(args, "export");
  if (exp && !json_is_null(exp)) {
    if (!json_is_boolean(exp)) {
      srv_request_finish(r, srv_tool_error_result("'export' must be true or false."));
      return;
    }
    if (json_is_true(exp) && !spec.session) {
      srv_request_finish(r, srv_tool_error_result("'export' returns a session's work directory: "
                                                  "it needs 'session'."));
      return;
    }
    spec.export_workspace = json_is_true(exp);
  }
  srv_session_t *session = srv_request_session(r);
  spec.principal = xstrdup(session ? srv_session_principal(session) : SRV_PRINCIPAL_STDIO);
  spec.script = xstrndup(json_string_value(script), json_string_length(script));
  spec.script_len = json_string_length(script);
  exec_submit(r, &spec);
}

/* Hosts commonly give up on a plain tool call after about a minute: a call allowed to run
 * longer becomes a task when its client can take one (the 2026-07-28 tasks extension). */
#define EXEC_TASK_THRESHOLD_S 60

bool srv_tool_execute_python_prefers_task(srv_server_t *s, json_t *arguments) {
  json_t *t = json_object_get(arguments, "timeout_seconds");
  return json_is_number(t) && json_number_value(t) > EXEC_TASK_THRESHOLD_S &&
         srv_server_config(s)->max_timeout > EXEC_TASK_THRESHOLD_S;
}

/* The structuredContent declaration: every field with its type. */
static json_t *output_schema(void) {
  static const struct {
    const char *name, *type, *description;
  } fields[] = {
      {"stdout", "string",
       "Standard output (the beginning and the end when it was longer than the limit)."},
      {"stderr", "string", "Standard error, same rules: the traceback of a failed script is here."},
      {"exit_code", "integer", "The exit status; -N when killed by signal N."},
      {"duration_ms", "integer", "Wall-clock run time."},
      {"timed_out", "boolean", "The timeout killed it."},
      {"truncated", "boolean", "Some output was cut to the limit."},
      {"stdout_bytes", "integer", "Bytes written to stdout in all."},
      {"stderr_bytes", "integer", "Bytes written to stderr in all."},
      {"sandbox", "string", "The sandbox backend that ran it."},
      {"cpu_user_ms", "integer", "User CPU time."},
      {"cpu_system_ms", "integer", "System CPU time."},
      {"max_rss_kib", "integer", "Peak resident memory of the largest process."},
      {"prestarted", "string",
       "What was set up before the call (--prestart): interpreter (the sandbox, with the "
       "interpreter already started), sandbox (the sandbox only) or no."},
      {"status_confirmed", "boolean",
       "The sandbox reported the script's own exit status and usage (false: the sandbox's own)."},
  };
  json_t *props = json_object();
  for (size_t i = 0; i < CM_ARRAY_SIZE(fields); i++)
    json_object_set_new(
        props, fields[i].name,
        json_pack("{s:s, s:s}", "type", fields[i].type, "description", fields[i].description));
  json_object_set_new(
      props, "python",
      json_pack("{s:s, s:{s:{s:s}, s:{s:s}, s:{s:s}}}", "type", "object", "properties", "version",
                "type", "string", "path", "type", "string", "implementation", "type", "string"));
  json_object_set_new(props, "limit",
                      json_pack("{s:[s, s], s:s}", "type", "string", "null", "description",
                                "The limit the run hit: \"timeout\", \"cpu\", \"file_size\", "
                                "\"memory\" or \"processes\" (a fork "
                                "was refused); null if none."));
  json_object_set_new(
      props, "memory_peak_bytes",
      json_pack(
          "{s:[s, s], s:s}", "type", "integer", "null", "description",
          "Peak memory of the whole process tree (from its cgroup); null when not measured."));
  json_object_set_new(props, "signal",
                      json_pack("{s:[s, s], s:s}", "type", "integer", "null", "description",
                                "The signal that killed the script, or null."));
  json_object_set_new(
      props, "environment",
      json_pack("{s:[s, s], s:s, s:{s:{s:s}, s:{s:s}, s:{s:s, s:{s:s}}}}", "type", "object", "null",
                "description",
                "The cached dependency environment used, or null without dependencies.",
                "properties", "key", "type", "string", "cached", "type", "boolean", "packages",
                "type", "object", "additionalProperties", "type", "string"));
  json_object_set_new(props, "files", files_output_schema());
  json_object_set_new(
      props, "session",
      json_pack("{s:s, s:s}", "type", "object", "description",
                "With the session argument: the session (id, state, calls, python, environment, "
                "memory, note: what happened to it in this call)."));
  json_object_set_new(props, "display",
                      json_pack("{s:[s, s], s:s}", "type", "string", "null", "description",
                                "In a session: repr() of the script's final expression, if any."));
  json_object_set_new(props, "call_status",
                      json_pack("{s:s, s:s}", "type", "string", "description",
                                "In a session: ok, error, interrupted, exit or kernel_died."));
  json_object_set_new(props, "network", srv_network_output_schema());
  return json_pack("{s:s, s:o, s:[s, s, s, s, s, s]}", "type", "object", "properties", props,
                   "required", "stdout", "stderr", "exit_code", "duration_ms", "timed_out",
                   "truncated");
}

json_t *srv_tool_execute_python_describe(srv_server_t *s) {
  const srv_config_t *cfg = srv_server_config(s);
  /* docker and none: the network is on, but no policy of ours applies to it. */
  bool unfiltered =
      cfg->network && !cfg->network_host && !srv_network_proxied(cfg, srv_server_backend_kind(s));
  cleanup_free char *desc = xasprintf(
      "Run a Python script in a sandbox and get back its output, its exit code and the files it "
      "writes to outputs/.\n"
      "\n"
      "How it runs: the script is saved as script.py in a fresh, empty working directory (deleted "
      "afterwards) and run with no standard input, a clean environment and these limits: "
      "timeout_seconds (default %llu, at most %llu; the whole process tree is killed when it "
      "expires), %llu bytes of stdout and of stderr kept (the beginning and the end of longer "
      "output), and the server's memory and process limits. %s\n"
      "\n"
      "Dependencies: the standard library needs nothing. Declare third-party packages in a PEP "
      "723 block at the top of the script:\n"
      "# /// script\n"
      "# requires-python = \">=3.11\"\n"
      "# dependencies = [\"requests<3\", \"rich\"]\n"
      "# ///\n"
      "or in the dependencies argument ([\"numpy\", \"pandas>=2\"]). They are installed once into "
      "a cached environment; the first call with a new set takes longer.\n"
      "\n"
      "Python version: python_version picks one (\"3.12\", \"3.13t\", \">=3.11\"); "
      "check_environment lists them.\n"
      "\n"
      "Files in: files=[{\"path\": \"data/input.csv\", \"content\": \"...\", \"encoding\": "
      "\"utf-8\" or \"base64\"}] are written into the working directory before the script starts "
      "(relative paths only; at most %llu files, %llu bytes each, %llu bytes in all).\n"
      "\n"
      "Files and plots out: write what you want back into the outputs/ directory (create it "
      "first: os.makedirs(\"outputs\", exist_ok=True)). Images (PNG, JPEG, GIF, WebP, SVG) up to "
      "%llu bytes come back as images, UTF-8 text files up to %llu bytes as embedded resources, "
      "anything else as a resource_link (sandbox://runs/...) to read with resources/read within "
      "%llu seconds; at most %llu files and %llu bytes per run. Matplotlib figures still open "
      "when the script ends are saved as outputs/figure-N.png (the Agg backend is preset; close a "
      "figure you saved yourself, or it comes back twice).\n"
      "\n"
      "Sessions: session: \"new\" runs the script in a new session and names it in the result; "
      "session: \"<id>\" runs the next script in it. A session keeps one Python process alive "
      "between calls (variables, imports, open files persist, like a notebook), and its working "
      "directory. The value of a final expression is printed. A timeout raises "
      "KeyboardInterrupt (the session survives); if the process dies (out of memory, a crash, it "
      "did not stop), its variables are lost but its files stay. A later call may add "
      "dependencies (the process restarts on a new environment). export: true returns the working "
      "directory as outputs/workspace.tar. Sessions end after %llu seconds without a call; "
      "list_sessions and close_session manage them.\n"
      "\n"
      "Result: a text block with '--- stdout ---', '--- stderr ---', '--- exit_code: N ---' and "
      "'--- duration_ms: N ---' sections (plus '--- timed_out: true ---' on timeout) and a line "
      "per returned file, then the images and resources, and the same data as structured content. "
      "A non-zero exit, a timeout or a kill is an error result: the traceback in stderr has your "
      "script's line numbers. Output is streamed as progress notifications when the client asks "
      "for progress.",
      (unsigned long long)cfg->default_timeout, (unsigned long long)cfg->max_timeout,
      (unsigned long long)cfg->max_output_bytes,
      !cfg->network ? "Network access is off on this server."
      : cfg->network_host
          ? "Network access is on (the host's own network); pass network: false to run without it."
      : unfiltered
          ? "Network access is on, not filtered: this sandbox backend does not apply the server's "
            "egress policy; pass network: false to run without it."
          : "Network access is on through the server's egress proxy (HTTP_PROXY/HTTPS_PROXY are "
            "set; "
            "loopback, private and metadata addresses are refused); pass network: false to run "
            "without it, or a list of destinations to allow only those.",
      (unsigned long long)cfg->max_input_files, (unsigned long long)cfg->max_input_file_bytes,
      (unsigned long long)cfg->max_input_bytes, (unsigned long long)cfg->max_inline_bytes,
      (unsigned long long)cfg->max_inline_text_bytes,
      (unsigned long long)(cfg->artifact_ttl_ms / 1000), (unsigned long long)cfg->max_output_files,
      (unsigned long long)cfg->max_artifact_bytes,
      (unsigned long long)(cfg->exec_session_idle_ms / 1000));
  json_t *input = json_pack(
      "{s:s, s:{s:{s:s, s:s}, s:{s:[{s:s, s:{s:s}}, {s:s}], s:n, s:s}, s:{s:s, s:I, s:I, s:I, "
      "s:s}}, s:[s], s:b}",
      "type", "object", "properties", "script", "type", "string", "description",
      "The Python source code to run. It may start with a PEP 723 '# /// script' metadata block.",
      "dependencies", "anyOf", "type", "array", "items", "type", "string", "type", "null",
      "default", "description",
      "Extra requirement strings (PEP 508), merged with the script's PEP 723 dependencies.",
      "timeout_seconds", "type", "integer", "minimum", (json_int_t)1, "maximum",
      (json_int_t)cfg->max_timeout, "default", (json_int_t)cfg->default_timeout, "description",
      "Wall-clock limit in seconds; the script and everything it started are killed when it "
      "expires.",
      "required", "script", "additionalProperties", 0);
  json_t *props = json_object_get(input, "properties");
  json_object_set_new(
      props, "python_version",
      json_pack(
          "{s:s, s:s}", "type", "string", "description",
          "Which Python to run: \"3.12\", \"3.12.1\", \"3.13t\" (free-threaded), \"pypy3.10\" or "
          "a specifier such as \">=3.11,<3.13\"; the newest match wins. Default: the script's "
          "requires-python, else the server's default. check_environment lists them."));
  json_object_set_new(
      props, "session",
      json_pack("{s:s, s:I, s:s}", "type", "string", "maxLength", (json_int_t)64, "description",
                "\"new\" starts a session (a Python process and working directory kept between "
                "calls) and runs the script in it; a session id from an earlier result runs the "
                "script in that session. Omit for a fresh sandbox."));
  json_object_set_new(props, "export",
                      json_pack("{s:s, s:b, s:s}", "type", "boolean", "default", 0, "description",
                                "With session: also return the session's working directory "
                                "(less outputs/) as outputs/workspace.tar."));
  json_t *file_item = json_pack(
      "{s:s, s:{s:{s:s, s:s}, s:{s:s}, s:{s:s, s:[s, s], s:s}}, s:[s, s], s:b}", "type", "object",
      "properties", "path", "type", "string", "description",
      "Relative path, e.g. \"data/input.csv\"; parent directories are created.", "content", "type",
      "string", "encoding", "type", "string", "enum", "utf-8", "base64", "default", "utf-8",
      "required", "path", "content", "additionalProperties", 0);
  json_object_set_new(props, "files",
                      json_pack("{s:s, s:I, s:s, s:o}", "type", "array", "maxItems",
                                (json_int_t)cfg->max_input_files, "description",
                                "Input files written into the working directory before the "
                                "script starts.",
                                "items", file_item));
  const char *net_desc =
      !cfg->network       ? "The network is off on this server; true or a list is refused."
      : cfg->network_host ? "false runs this call without any network access. (This server shares "
                            "its own network with scripts.)"
      : unfiltered        ? "false runs this call without any network access where the backend can "
                            "isolate it. (This "
                            "backend does not filter the network: a list of destinations is refused.)"
                   : "false: no network at all. true (the default): the public internet through "
                     "the server's egress proxy "
                     "(the sandbox's HTTP_PROXY/HTTPS_PROXY/ALL_PROXY; loopback, private, "
                     "link-local and metadata addresses "
                     "are refused unless the server allows them). A list of destinations "
                     "(\"api.github.com\", "
                     "\"*.example.com:443\", \"93.184.216.0/24\") allows only those, within what "
                     "the server allows; an entry "
                     "the server denies entirely is an error. Refused destinations are listed in "
                     "the result.";
  json_object_set_new(
      props, "network",
      json_pack("{s:[{s:s}, {s:s, s:{s:s}, s:I}], s:b, s:s}", "anyOf", "type", "boolean", "type",
                "array", "items", "type", "string", "maxItems", (json_int_t)SRV_NET_MAX_CALL_RULES,
                "default", cfg->network, "description", net_desc));
  return json_pack("{s:s, s:s, s:s, s:o, s:o, s:{s:s, s:b, s:b, s:b, s:b}}", "name",
                   "execute_python", "title", "Run Python in a sandbox", "description", desc,
                   "inputSchema", input, "outputSchema", output_schema(), "annotations", "title",
                   "Run Python in a sandbox", "readOnlyHint", 0, "destructiveHint", 0,
                   "idempotentHint", 0, "openWorldHint", cfg->network);
}
