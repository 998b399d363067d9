/* execute_python: its arguments become a run spec (server/exec/), which the execution
 * state runs; and the tool's description. */
#include <stdio.h>

#include "server/exec/exec.h"
#include "server/tools/tools-internal.h"

#define EXEC_MAX_DEPENDENCIES 256

static const char *const known_args[] = {
    "script",  "dependencies", "timeout_seconds", "python_version", "files",  "network",
    "session", "export",       "background",      "details",        "secrets"};

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
                                                  "export, background, details, secrets.",
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
  srv_session_t *mcp_session = srv_request_session(r);
  const char *principal = mcp_session ? srv_session_principal(mcp_session) : SRV_PRINCIPAL_STDIO;
  json_t *secrets = json_object_get(args, "secrets");
  if (srv_secrets_parse_call(srv_server_network(s), cfg, srv_server_backend_kind(s), principal,
                             &spec.net, secrets, &spec.secrets, &net_error) < 0) {
    srv_request_finish(r, srv_tool_error_result("%s", net_error));
    return;
  }
  json_t *ses_arg = json_object_get(args, "session");
  if (spec.secrets.n && ses_arg && !json_is_null(ses_arg)) {
    srv_request_finish(r, srv_tool_error_result(
                              "'secrets' cannot be combined with 'session' yet: a session's "
                              "sandbox outlives the call, and a secret is given to one call only. "
                              "Run the call that needs the secret without 'session'."));
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
  json_t *det = json_object_get(args, "details");
  if (det && !json_is_null(det)) {
    if (!json_is_boolean(det)) {
      srv_request_finish(r, srv_tool_error_result("'details' must be true or false."));
      return;
    }
    spec.details = json_is_true(det);
  }
  json_t *bg = json_object_get(args, "background");
  if (bg && !json_is_null(bg) && !json_is_boolean(bg)) {
    srv_request_finish(r, srv_tool_error_result("'background' must be true or false."));
    return;
  }
  srv_session_t *session = srv_request_session(r);
  spec.principal = xstrdup(session ? srv_session_principal(session) : SRV_PRINCIPAL_STDIO);
  spec.script = xstrndup(json_string_value(script), json_string_length(script));
  spec.script_len = json_string_length(script);
  if (json_is_true(bg)) {
    /* The client hears the run's id now; the run goes on without it (wait_run). Inside a
     * task or a batch the call just runs. */
    json_t *refusal;
    if (!srv_request_background(r, &refusal) && refusal) {
      srv_request_finish(r, refusal);
      return;
    }
  }
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

/* The structuredContent declaration: what every result has (details: true adds the run's
 * metadata, which the schema allows without listing: tools/list is read by every agent in
 * every conversation). */
static json_t *output_schema(void) {
  return json_pack(
      "{s:s, s:{s:{s:s}, s:{s:s}, s:{s:[s, s]}, s:{s:s}, s:{s:s}, s:{s:s}}, s:[s, s, s]}", "type",
      "object", "properties", "stdout", "type", "string", "stderr", "type", "string", "exit_code",
      "type", "integer", "null", "error", "type", "string", "files", "type", "array", "run_id",
      "type", "string", "required", "stdout", "stderr", "exit_code");
}

json_t *srv_tool_execute_python_describe(srv_server_t *s) {
  const srv_config_t *cfg = srv_server_config(s);
  /* docker and none: the network is on, but no policy of ours applies to it. */
  bool unfiltered =
      cfg->network && !cfg->network_host && !srv_network_proxied(cfg, srv_server_backend_kind(s));
  cleanup_free char *desc = xasprintf(
      "Runs a Python script in a fresh sandbox: stdout, stderr, exit code, and the files it "
      "writes to outputs/ (images, open matplotlib figures). Timeout %llus by default, %llus at "
      "most. %s\n"
      "Packages: a PEP 723 block (# /// script, # dependencies = [\"numpy\"], # ///) or "
      "dependencies; cached.\n"
      "session: \"new\" keeps the process and files for later calls with the returned id.\n"
      "Over a minute? background: true answers at once with a run_id; then wait_run(run_id) "
      "until it ends.",
      (unsigned long long)cfg->default_timeout, (unsigned long long)cfg->max_timeout,
      !cfg->network       ? "No network."
      : cfg->network_host ? "Network: the host's."
      : unfiltered        ? "Network: not filtered (this backend)."
                          : "Network: the internet through a filtering proxy.");
  json_t *input = json_pack(
      "{s:s, s:{s:{s:s}, s:{s:s, s:{s:s}}, s:{s:s, s:I, s:I, s:I}, s:{s:s}}, s:[s]}", "type",
      "object", "properties", "script", "type", "string", "dependencies", "type", "array", "items",
      "type", "string", "timeout_seconds", "type", "integer", "minimum", (json_int_t)1, "maximum",
      (json_int_t)cfg->max_timeout, "default", (json_int_t)cfg->default_timeout, "python_version",
      "type", "string", "required", "script");
  json_t *props = json_object_get(input, "properties");
  json_object_set_new(props, "session", json_pack("{s:s}", "type", "string"));
  json_object_set_new(
      props, "export",
      json_pack("{s:s, s:s}", "type", "boolean", "description", "Session files as a tar."));
  json_t *file_item =
      json_pack("{s:s, s:{s:{s:s}, s:{s:s}, s:{s:[s, s]}}, s:[s, s]}", "type", "object",
                "properties", "path", "type", "string", "content", "type", "string", "encoding",
                "enum", "utf-8", "base64", "required", "path", "content");
  json_object_set_new(props, "files",
                      json_pack("{s:s, s:I, s:o}", "type", "array", "maxItems",
                                (json_int_t)cfg->max_input_files, "items", file_item));
  const char *net_desc = !cfg->network       ? "Off on this server."
                         : cfg->network_host ? "false: no network."
                         : unfiltered        ? "false: none (a list of destinations is refused)."
                                             : "false: none; a host list: only those.";
  json_object_set_new(props, "network",
                      json_pack("{s:[{s:s}, {s:s, s:{s:s}, s:I}], s:s}", "anyOf", "type", "boolean",
                                "type", "array", "items", "type", "string", "maxItems",
                                (json_int_t)SRV_NET_MAX_CALL_RULES, "description", net_desc));
  json_object_set_new(
      props, "background",
      json_pack("{s:s, s:s}", "type", "boolean", "description", "Answer at once with a run_id."));
  json_object_set_new(
      props, "details",
      json_pack("{s:s, s:s}", "type", "boolean", "description", "Add the run's metadata."));
  /* Declared where there are secrets only, and briefly: tools/list is in every agent's
   * context (the README and check_environment say the rest). */
  if (cfg->n_secrets)
    json_object_set_new(props, "secrets",
                        json_pack("{s:s, s:{s:s}, s:s}", "type", "array", "items", "type", "string",
                                  "description", "Secret names (check_environment)"));
  return json_pack("{s:s, s:s, s:s, s:o, s:o, s:{s:b, s:b, s:b}}", "name", "execute_python",
                   "title", "Run Python in a sandbox", "description", desc, "inputSchema", input,
                   "outputSchema", output_schema(), "annotations", "readOnlyHint", 0,
                   "destructiveHint", 0, "openWorldHint", cfg->network);
}
