/* The JSON-RPC/MCP router: envelope checks, lifecycle, dispatch to the tool table it is given
 * and to an extension, and the protocol's own methods.  Transport-neutral: everything goes
 * out through tr_sink_t. */
#include <stdio.h>

#include "server/core/core-internal.h"

/* A batch is one message whose answers are built in memory before any is sent: a few
 * bytes per element could ask for megabytes each (resources/read, tools/list).  So it
 * has at most this many elements, and its answers together at most max_bytes; past that
 * an element gets an error (and no work is done for it). */
#define SRV_MAX_BATCH 256

/* ---------------------------------------------------------------- extensions */

void srv_server_set_extension(srv_server_t *s, const srv_extension_t *ext) {
  s->ext = ext;
}

static const srv_tool_t *tool_find(const srv_tool_t *tools, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(tools[i].name, name) == 0) return &tools[i];
  return NULL;
}

/* Offers the request to the extension; true if it took it. */
static bool extension_request(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink,
                              srv_batch_t *batch, const srv_modern_t *mm) {
  const srv_extension_t *ext = ss->server->ext;
  if (!ext || !ext->handle) return false;
  srv_request_t *r = srv_request_new(ss, m->id, sink, batch, mm);
  r->method = xstrdup(m->method);
  r->params = json_incref(m->params);
  srv_request_set_progress_token(r, m->params);
  if (ext->handle(ext->data, r, m->method, m->params)) return true;
  /* Not its method: r goes without a trace (its batch slot stays null), and an ephemeral
   * session stays for the router's own method. */
  if (r->own_session) {
    r->own_session = false;
    ss->owned = false;
    ss->refs--; /* the router still holds one */
  }
  r->cancelled = true;
  srv_request_complete(r, NULL);
  return false;
}

/* ---------------------------------------------------------------- methods */

/* Whether the request's client advertised MCP Apps (core.h): its capabilities, from
 * initialize (the handshake era) or the request's _meta (the modern one). */
static bool apps_advertised(const srv_session_t *ss, const srv_modern_t *mm) {
  if (!ss->server->app) return false;
  json_t *caps = mm ? mm->client_caps : ss->client_capabilities;
  json_t *ext = json_is_object(caps) ? json_object_get(caps, "extensions") : NULL;
  json_t *ui = json_is_object(ext) ? json_object_get(ext, SRV_UI_EXTENSION) : NULL;
  if (!json_is_object(ui)) return false;
  json_t *types = json_object_get(ui, "mimeTypes");
  if (!json_is_array(types)) return true; /* no list: the extension's one type */
  size_t i;
  json_t *v;
  json_array_foreach(types, i, v) {
    if (json_is_string(v) && strcmp(json_string_value(v), SRV_APP_MIME) == 0) return true;
  }
  return false;
}

/* The extension's entry in the server's capabilities, for a client that advertised it. */
static void add_apps_capability(json_t *caps) {
  json_t *ext = json_object_get(caps, "extensions");
  if (!json_is_object(ext)) {
    ext = json_object();
    json_object_set_new(caps, "extensions", ext);
  }
  json_object_set_new(ext, SRV_UI_EXTENSION, json_pack("{s:[s]}", "mimeTypes", SRV_APP_MIME));
}

/* Tasks came with 2025-11-25: a session that negotiated an older version is not offered
 * them, so it gets none (its params.task is ignored, tasks/ methods do not exist for it). */
static bool tasks_offered(const char *protocol) {
  return protocol && strcmp(protocol, "2025-11-25") >= 0;
}

/* protocol: the handshake era's negotiated version, or NULL for the modern era (whose tasks
 * are an extension: handle_discover). */
static json_t *server_capabilities(const char *protocol) {
  json_t *caps = json_pack("{s:{s:b}, s:{s:b, s:b}, s:{}}", "tools", "listChanged", 0, "resources",
                           "listChanged", 0, "subscribe", 0, "logging");
  if (tasks_offered(protocol)) json_object_set_new(caps, "tasks", srv_tasks_capability());
  return caps;
}

/* The built-in capabilities with the extension's merged in. */
static json_t *merged_capabilities(const srv_server_t *s, const char *protocol) {
  json_t *caps = server_capabilities(protocol);
  const srv_extension_t *ext = s->ext;
  if (ext && ext->capabilities) {
    json_t *extra = ext->capabilities(ext->data);
    if (json_is_object(extra)) json_object_update(caps, extra);
    json_decref(extra);
  }
  return caps;
}

static const char server_instructions[] =
    "Runs Python scripts in a sandbox. Use execute_python to run a script (declare third-party "
    "packages "
    "in a PEP 723 '# /// script' block or the dependencies argument), validate_script to check "
    "one "
    "without running it, and check_environment to see the interpreters, sandbox and limits.";

/* Replies with a result (stolen), decorated as the modern era wants when mm is set. */
static void reply_result(tr_sink_t *sink, srv_batch_t *batch, json_t *id, json_t *result,
                         const srv_modern_t *mm) {
  if (mm) srv_modern_decorate(result);
  srv_reply_result(sink, batch, id, result);
}

/* R5 for the router's own answers (srv_modern_cache_hints). */
static void add_cache_hints(json_t *result, const char *method, json_int_t ttl_ms,
                            const srv_modern_t *mm) {
  if (mm) srv_modern_cache_hints(result, method, ttl_ms);
}

static void handle_initialize(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink,
                              srv_batch_t *batch) {
  if (ss->protocol) {
    srv_reply_error(sink, batch, id, JSONRPC_INVALID_REQUEST,
                    "Invalid Request: the session is already initialized");
    return;
  }
  json_t *pv = params ? json_object_get(params, "protocolVersion") : NULL;
  if (!json_is_object(params) || !json_is_string(pv)) {
    srv_reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS,
                    "Invalid params: initialize needs a string \"protocolVersion\"");
    return;
  }
  const char *requested = json_string_value(pv);
  const char *chosen = srv_protocol_supported(requested) ? requested : srv_protocol_versions[0];
  ss->protocol = xstrdup(chosen);
  json_t *ci = json_object_get(params, "clientInfo");
  if (json_is_object(ci)) ss->client_info = json_incref(ci);
  json_t *client_caps = json_object_get(params, "capabilities");
  if (json_is_object(client_caps)) ss->client_capabilities = json_incref(client_caps);
  json_t *caps = merged_capabilities(ss->server, chosen);
  if (apps_advertised(ss, NULL)) add_apps_capability(caps);
  json_t *result =
      json_pack("{s:s, s:o, s:{s:s, s:s, s:s}, s:s}", "protocolVersion", chosen, "capabilities",
                caps, "serverInfo", "name", SRV_NAME, "title", "Python Exec Sandbox", "version",
                srv_version(), "instructions", server_instructions);
  srv_reply_result(sink, batch, id, result);
}

/* The Tool object, with the task support the router acts on (T1). */
static json_t *describe_tool(srv_server_t *s, const srv_tool_t *tool, bool apps) {
  json_t *t = tool->describe(s);
  static const char *const names[] = {NULL, "optional", "required"};
  if (tool->task_support != SRV_TASK_FORBIDDEN && json_is_object(t))
    json_object_set_new(t, "execution",
                        json_pack("{s:s}", "taskSupport", names[tool->task_support]));
  if (apps && json_is_object(t) && strcmp(tool->name, s->app->tool) == 0) {
    json_t *meta = json_object_get(t, "_meta");
    if (!json_is_object(meta)) {
      meta = json_object();
      json_object_set_new(t, "_meta", meta);
    }
    /* ui.resourceUri, and the flat key of the extension's first drafts that hosts still read. */
    json_object_set_new(meta, "ui", json_pack("{s:s}", "resourceUri", s->app->uri));
    json_object_set_new(meta, "ui/resourceUri", json_string(s->app->uri));
  }
  return t;
}

static void handle_tools_list(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink,
                              srv_batch_t *batch, const srv_modern_t *mm) {
  json_t *cursor = params && json_is_object(params) ? json_object_get(params, "cursor") : NULL;
  if (cursor) {
    /* Everything fits on one page, so no cursor we could have issued exists. */
    srv_reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS, "Invalid params: unknown cursor");
    return;
  }
  const srv_tool_t *tools = ss->server->tools;
  bool apps = apps_advertised(ss, mm);
  json_t **cached = &ss->server->tools_list[mm != NULL][apps];
  if (!*cached) {
    json_t *list = json_array();
    for (size_t i = 0; i < ss->server->n_tools; i++)
      json_array_append_new(list, describe_tool(ss->server, &tools[i], apps));
    const srv_extension_t *ext = ss->server->ext;
    for (size_t i = 0; ext && i < ext->n_tools; i++)
      json_array_append_new(list, describe_tool(ss->server, &ext->tools[i], apps));
    *cached = list;
  }
  /* Shared, never changed: the answer is serialised before the next request is read. */
  json_t *result = json_pack("{s:O}", "tools", *cached);
  add_cache_hints(result, "tools/list", 60000, mm);
  reply_result(sink, batch, id, result, mm);
}

static bool header_token(const char *v) {
  if (!*v || strlen(v) > 64) return false;
  for (const char *p = v; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '-'))
      return false;
  return true;
}

static void add_param_headers(json_t *out, json_t *tool) {
  json_t *name = json_object_get(tool, "name");
  json_t *schema = json_object_get(tool, "inputSchema");
  json_t *props = json_is_object(schema) ? json_object_get(schema, "properties") : NULL;
  if (!json_is_string(name) || !json_is_object(props)) return;
  const char *key;
  json_t *prop;
  json_object_foreach(props, key, prop) {
    json_t *header = json_is_object(prop) ? json_object_get(prop, "x-mcp-header") : NULL;
    if (!json_is_string(header) || !header_token(json_string_value(header))) continue;
    json_array_append_new(
        out, json_pack("{s:O, s:s, s:O}", "tool", name, "property", key, "header", header));
  }
}

json_t *srv_server_param_headers(srv_server_t *s) {
  json_t *out = json_array();
  for (size_t i = 0; i < s->n_tools; i++) {
    json_t *tool = s->tools[i].describe(s);
    add_param_headers(out, tool);
    json_decref(tool);
  }
  for (size_t i = 0; s->ext && i < s->ext->n_tools; i++) {
    json_t *tool = s->ext->tools[i].describe(s);
    add_param_headers(out, tool);
    json_decref(tool);
  }
  return out;
}

static void handle_tools_call(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink,
                              srv_batch_t *batch, const srv_modern_t *mm) {
  json_t *name = json_is_object(params) ? json_object_get(params, "name") : NULL;
  if (!json_is_string(name)) {
    srv_reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS,
                    "Invalid params: tools/call needs a string \"name\"");
    return;
  }
  json_t *args = json_object_get(params, "arguments");
  if (args && !json_is_object(args) && !json_is_null(args)) {
    srv_reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS,
                    "Invalid params: \"arguments\" must be an object");
    return;
  }
  srv_server_t *s = ss->server;
  const srv_tool_t *tool = tool_find(s->tools, s->n_tools, json_string_value(name));
  if (!tool && s->ext) tool = tool_find(s->ext->tools, s->ext->n_tools, json_string_value(name));
  if (!tool) {
    cleanup_free char *excerpt =
        cm_log_excerpt(json_string_value(name), json_string_length(name), 64);
    cleanup_free char *msg = xasprintf("Invalid params: unknown tool '%s'", excerpt);
    srv_reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS, msg);
    return;
  }
  if (s->draining) {
    reply_result(sink, batch, id,
                 srv_tool_error_result("The server is shutting down (draining): this call was "
                                       "not started. Call again later, or on another server."),
                 mm);
    return;
  }
  json_t *arguments = json_is_object(args) ? json_incref(args) : json_object();
  bool as_task;
  if (!mm) {
    /* The handshake era: the client asks for a task with params.task (2025-11-25). */
    as_task = tasks_offered(ss->protocol) && srv_tasks_requested(params);
    if (as_task ? tool->task_support == SRV_TASK_FORBIDDEN
                : tool->task_support == SRV_TASK_REQUIRED) {
      cleanup_free char *msg =
          xasprintf("Method not found: tool '%s' %s", tool->name,
                    as_task ? "does not run as a task (its execution.taskSupport is forbidden)"
                            : "runs only as a task (send \"task\" in the params)");
      srv_reply_error(sink, batch, id, JSONRPC_METHOD_NOT_FOUND, msg);
      json_decref(arguments);
      return;
    }
  } else {
    /* The tasks extension: the server decides, only for a client that declared it; a
     * tool that runs only as a task needs the declaration. */
    bool declared = srv_tasks_declared(mm);
    if (tool->task_support == SRV_TASK_REQUIRED && !declared) {
      cleanup_free char *what = xasprintf("tool '%s'", tool->name);
      srv_tasks_reply_missing(sink, id, what);
      json_decref(arguments);
      return;
    }
    /* The client asked for a call, not a task: one the server would make a task of runs
     * plainly when the principal has no room for another (its tasks are kept for their
     * TTL, which the client cannot shorten in this era). */
    as_task = declared && (tool->task_support == SRV_TASK_REQUIRED ||
                           (tool->task_support == SRV_TASK_OPTIONAL && tool->prefers_task &&
                            tool->prefers_task(s, arguments) && srv_tasks_room(s, ss->principal)));
  }
  if (as_task) {
    srv_task_call(ss, tool, id, params, arguments, sink, batch, mm);
  } else {
    srv_request_t *r = srv_request_new(ss, id, sink, batch, mm);
    /* An extension's tool may need the whole params (srv_request_params); the built-in
     * ones get what they need as arguments, and their params (a script, its input files)
     * are not kept for the run's life. */
    if (s->ext && tool >= s->ext->tools && tool < s->ext->tools + s->ext->n_tools)
      r->params = json_incref(params);
    srv_request_set_progress_token(r, params);
    srv_request_start_heartbeat(r);
    srv_request_audit_begin(r, tool->name, NULL, sink);
    tool->call(r, arguments);
  }
  json_decref(arguments);
}

static void handle_set_level(srv_session_t *ss, json_t *id, json_t *params, tr_sink_t *sink,
                             srv_batch_t *batch) {
  json_t *level = json_is_object(params) ? json_object_get(params, "level") : NULL;
  int idx = json_is_string(level) ? srv_log_level_index(json_string_value(level)) : -1;
  if (idx < 0) {
    srv_reply_error(sink, batch, id, JSONRPC_INVALID_PARAMS,
                    "Invalid params: \"level\" must be one of debug, info, notice, warning, error, "
                    "critical, alert, emergency");
    return;
  }
  ss->log_level = idx;
  srv_reply_result(sink, batch, id, json_object());
}

/* MCP's "resource not found" (resources/read, protocol versions 2024-11-05 to 2025-11-25). */

/* resources/list, resources/read, resources/templates/list: the artifacts of runs. */
static void handle_resources(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink,
                             srv_batch_t *batch, const srv_modern_t *mm) {
  json_t *params = json_is_object(m->params) ? m->params : NULL;
  if (m->params && !params && !json_is_null(m->params)) {
    srv_reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS,
                    "Invalid params: params must be an object");
    return;
  }
  json_t *cursor = params ? json_object_get(params, "cursor") : NULL;
  if (cursor && !json_is_null(cursor) && !json_is_string(cursor)) {
    srv_reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS,
                    "Invalid params: \"cursor\" must be a string");
    return;
  }
  const char *cursor_text = json_is_string(cursor) ? json_string_value(cursor) : NULL;
  json_t *uri = params ? json_object_get(params, "uri") : NULL;
  json_t *result = NULL;
  cm_error_t err = CM_ERROR_INIT;
  int rc = 0;
  if (strcmp(m->method, "resources/templates/list") == 0) {
    if (cursor_text)
      rc = cm_error_set(&err, 0, CM_ERR_INVALID, "unknown cursor");
    else
      result = art_store_templates();
  } else if (strcmp(m->method, "resources/list") == 0) {
    rc = art_store_list(ss->server->artifacts, ss->principal, cursor_text, &result, &err);
    const srv_app_t *app = ss->server->app;
    json_t *list = rc == 0 ? json_object_get(result, "resources") : NULL;
    if (json_is_array(list) && !cursor_text && apps_advertised(ss, mm))
      json_array_insert_new(
          list, 0,
          json_pack("{s:s, s:s, s:s, s:s, s:s, s:{s:{s:b}}}", "uri", app->uri, "name", app->name,
                    "title", app->title, "description", app->description, "mimeType", SRV_APP_MIME,
                    "_meta", "ui", "prefersBorder", 1));
  } else if (json_is_string(uri) && ss->server->app &&
             strcmp(json_string_value(uri), ss->server->app->uri) == 0) {
    const srv_app_t *app = ss->server->app;
    /* The app needs nothing from elsewhere (its script and style are inline): an empty
     * csp asks the host for its strictest policy. */
    result = json_pack("{s:[{s:s, s:s, s:s%, s:{s:{s:{}, s:b}}}]}", "contents", "uri", app->uri,
                       "mimeType", SRV_APP_MIME, "text", app->html, app->len, "_meta", "ui", "csp",
                       "prefersBorder", 1);
  } else if (!json_is_string(uri) || strlen(json_string_value(uri)) != json_string_length(uri)) {
    rc = cm_error_set(&err, 0, CM_ERR_INVALID, "resources/read needs a string \"uri\"");
  } else {
    /* In a batch, a file whose answer cannot fit is not even read. */
    rc = art_store_read(ss->server->artifacts, ss->principal, json_string_value(uri),
                        batch ? batch->max_bytes - batch->bytes : 0, &result, &err);
  }
  if (rc == 0) {
    /* A principal's artifacts come and go: a list is good for now only. */
    add_cache_hints(result, m->method, 0, mm);
    reply_result(sink, batch, m->id, result, mm);
    return;
  }
  if (err.kind == CM_ERR_NOT_FOUND) {
    cleanup_free char *excerpt =
        cm_log_excerpt(json_string_value(uri), json_string_length(uri), 200);
    cleanup_free char *msg =
        xasprintf("Resource not found: %s: %s", excerpt, cm_error_message(&err));
    /* R7: -32002 is gone in 2026-07-28; not found is invalid params there, with data.uri. */
    srv_deliver(sink, batch, srv_batch_reserve(batch),
                srv_jsonrpc_error(m->id, mm ? JSONRPC_INVALID_PARAMS : MCP_RESOURCE_NOT_FOUND, msg,
                                  json_pack("{s:O}", "uri", uri)));
  } else if (err.kind == CM_ERR_LIMIT && batch) {
    srv_deliver(sink, batch, srv_batch_reserve(batch), srv_batch_full_error(batch, m->id));
  } else if (err.kind == CM_ERR_INVALID || err.kind == CM_ERR_LIMIT) {
    cleanup_free char *msg = xasprintf("Invalid params: %s", cm_error_message(&err));
    srv_reply_error(sink, batch, m->id, JSONRPC_INVALID_PARAMS, msg);
  } else {
    cm_warn("%s: %s", m->method, cm_error_message(&err));
    cleanup_free char *msg = xasprintf("Internal error: %s", cm_error_message(&err));
    srv_reply_error(sink, batch, m->id, JSONRPC_INTERNAL_ERROR, msg);
  }
  cm_error_release(&err);
}

static void handle_request(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink,
                           srv_batch_t *batch) {
  const char *method = m->method;
  if (strcmp(method, "ping") == 0) {
    srv_reply_result(sink, batch, m->id, json_object());
    return;
  }
  if (strcmp(method, "initialize") == 0) {
    handle_initialize(ss, m->id, m->params, sink, batch);
    return;
  }
  if (!ss->protocol) {
    srv_reply_error(sink, batch, m->id, JSONRPC_INVALID_REQUEST,
                    "Invalid Request: the session is not initialized; send initialize first");
    return;
  }
  if (srv_request_find(ss, m->id)) {
    srv_reply_error(sink, batch, m->id, JSONRPC_INVALID_REQUEST,
                    "Invalid Request: a request with this id is still in flight");
    return;
  }
  if (srv_batch_full(batch)) {
    srv_deliver(sink, batch, srv_batch_reserve(batch), srv_batch_full_error(batch, m->id));
    return;
  }
  if (extension_request(ss, m, sink, batch, NULL)) return;
  if (tasks_offered(ss->protocol) && srv_tasks_handle(ss, m, sink, batch, NULL)) return;
  if (strcmp(method, "tools/list") == 0) {
    handle_tools_list(ss, m->id, m->params, sink, batch, NULL);
  } else if (strcmp(method, "tools/call") == 0) {
    handle_tools_call(ss, m->id, m->params, sink, batch, NULL);
  } else if (strcmp(method, "logging/setLevel") == 0) {
    handle_set_level(ss, m->id, m->params, sink, batch);
  } else if (strcmp(method, "resources/list") == 0 || strcmp(method, "resources/read") == 0 ||
             strcmp(method, "resources/templates/list") == 0) {
    handle_resources(ss, m, sink, batch, NULL);
  } else {
    cleanup_free char *excerpt = cm_log_excerpt(method, strlen(method), 64);
    cleanup_free char *msg = xasprintf("Method not found: %s", excerpt);
    srv_reply_error(sink, batch, m->id, JSONRPC_METHOD_NOT_FOUND, msg);
  }
}

/* ---------------------------------------------------------------- the modern era
 *
 * Protocol revision 2026-07-28 beside the handshake era (docs/protocol-2026.md, section 2).
 * A request whose params._meta claims a protocol version is modern, whatever its method;
 * so is every request of an ephemeral session (an HTTP POST the transport found modern)
 * and of a stdio process pinned to the revision.  On stdio, server/discover (the dual-era
 * client's probe) is served without pinning the process; initialize pins it to the
 * handshake era (ss->protocol), any other valid modern request to the modern one. */

static bool claims_modern(const srv_msg_t *m) {
  json_t *meta = json_is_object(m->params) ? json_object_get(m->params, "_meta") : NULL;
  return json_is_object(meta) && json_object_get(meta, MCP_META_PROTOCOL) != NULL;
}

/* Every version we serve, the modern ones first (server/discover, -32022's data). */
static json_t *all_versions(void) {
  json_t *v = json_array();
  for (size_t i = 0; i < srv_modern_versions_count; i++)
    json_array_append_new(v, json_string(srv_modern_versions[i]));
  for (size_t i = 0; i < srv_protocol_versions_count; i++)
    json_array_append_new(v, json_string(srv_protocol_versions[i]));
  return v;
}

/* The envelope checks R1-R2, in order; answers (with the request's id) and returns false
 * when one fails. */
static bool modern_envelope(const srv_msg_t *m, tr_sink_t *sink, srv_modern_t *out) {
  json_t *params = m->params;
  json_t *meta = json_is_object(params) ? json_object_get(params, "_meta") : NULL;
  json_t *version = json_is_object(meta) ? json_object_get(meta, MCP_META_PROTOCOL) : NULL;
  json_t *caps = json_is_object(meta) ? json_object_get(meta, MCP_META_CLIENT_CAPS) : NULL;
  json_t *info = json_is_object(meta) ? json_object_get(meta, MCP_META_CLIENT_INFO) : NULL;
  json_t *level = json_is_object(meta) ? json_object_get(meta, MCP_META_LOG_LEVEL) : NULL;
  const char *why = NULL;
  if (params && !json_is_object(params))
    why = "params must be an object";
  else if (!meta)
    why = "protocol revision 2026-07-28 needs \"_meta\" with \"" MCP_META_PROTOCOL
          "\" and \"" MCP_META_CLIENT_CAPS "\" on every request";
  else if (!json_is_object(meta))
    why = "\"_meta\" must be an object";
  else if (!json_is_string(version))
    why = "_meta[\"" MCP_META_PROTOCOL "\"] must be a string";
  else if (!json_is_object(caps))
    why = "_meta[\"" MCP_META_CLIENT_CAPS "\"] must be an object";
  else if (info && !json_is_object(info))
    why = "_meta[\"" MCP_META_CLIENT_INFO "\"] must be an object";
  else if (level && (!json_is_string(level) || srv_log_level_index(json_string_value(level)) < 0))
    why = "_meta[\"" MCP_META_LOG_LEVEL
          "\"] must be one of debug, info, notice, warning, error, critical, alert, emergency";
  if (why) {
    cleanup_free char *msg = xasprintf("Invalid params: %s", why);
    srv_reply_error(sink, NULL, m->id, JSONRPC_INVALID_PARAMS, msg);
    return false;
  }
  const char *v = json_string_value(version);
  if (strlen(v) != json_string_length(version) || !srv_modern_supported(v)) {
    cleanup_free char *excerpt = cm_log_excerpt(v, json_string_length(version), 40);
    cleanup_free char *msg = xasprintf("Unsupported protocol version: %s", excerpt);
    srv_deliver(sink, NULL, 0,
                srv_jsonrpc_error(
                    m->id, MCP_UNSUPPORTED_VERSION, msg,
                    json_pack("{s:o, s:O}", "supported", all_versions(), "requested", version)));
    return false;
  }
  out->version = v;
  out->client_caps = caps;
  out->log_level = level ? srv_log_level_index(json_string_value(level)) : -1;
  return true;
}

/* What the modern era serves: the built-in capabilities and the extension's, resources
 * announcing list changes (a principal's artifacts come with its runs) on
 * subscriptions/listen, and tasks as the io.modelcontextprotocol/tasks extension (T4). */
static json_t *modern_capabilities(srv_server_t *s) {
  json_t *caps = server_capabilities(NULL);
  /* (resources/subscribe is gone; resourceSubscriptions on a listen stream took its place,
   * which the product cannot serve: its artifacts never change) */
  json_t *resources = json_object_get(caps, "resources");
  json_object_del(resources, "subscribe");
  json_object_set_new(resources, "listChanged", json_true());
  const srv_extension_t *ext = s->ext;
  if (ext && ext->capabilities) {
    json_t *extra = ext->capabilities(ext->data);
    if (json_is_object(extra)) json_object_update(caps, extra);
    json_decref(extra);
  }
  json_t *extensions = json_object_get(caps, "extensions");
  if (!json_is_object(extensions)) {
    extensions = json_object();
    json_object_set_new(caps, "extensions", extensions);
  }
  json_object_set_new(extensions, SRV_TASKS_EXTENSION, json_object());
  return caps;
}

/* server/discover: what the modern era serves, and every version, so that a dual-era client
 * can choose. */
static void handle_discover(srv_session_t *ss, json_t *id, tr_sink_t *sink,
                            const srv_modern_t *mm) {
  json_t *caps = modern_capabilities(ss->server);
  if (apps_advertised(ss, mm)) add_apps_capability(caps);
  json_t *result = json_pack("{s:o, s:o, s:s}", "supportedVersions", all_versions(), "capabilities",
                             caps, "instructions", server_instructions);
  /* The same for everyone, but an upgrade may change it. */
  add_cache_hints(result, "server/discover", 60000, mm);
  reply_result(sink, NULL, id, result, mm);
}

/* Methods of the handshake era that 2026-07-28 removed. */
static bool removed_method(const char *method) {
  static const char *const removed[] = {"initialize", "ping", "logging/setLevel",
                                        "resources/subscribe", "resources/unsubscribe"};
  for (size_t i = 0; i < CM_ARRAY_SIZE(removed); i++)
    if (strcmp(method, removed[i]) == 0) return true;
  return false;
}

static void handle_modern(srv_session_t *ss, const srv_msg_t *m, tr_sink_t *sink) {
  const char *method = m->method;
  if (strcmp(method, "initialize") == 0) {
    /* Whatever its _meta: the versioning page's SHOULD for a modern-only answer names
     * what is served, so that a client can tell "try another era" from a broken server. */
    cleanup_free char *msg = xasprintf(
        "Method not found: initialize is not part of protocol revision %s (this %s serves it "
        "statelessly: send server/discover); handshake versions: %s, %s, %s, %s",
        srv_modern_versions[0], ss->ephemeral ? "request" : "process", srv_protocol_versions[0],
        srv_protocol_versions[1], srv_protocol_versions[2], srv_protocol_versions[3]);
    srv_reply_error(sink, NULL, m->id, JSONRPC_METHOD_NOT_FOUND, msg);
    return;
  }
  srv_modern_t mm;
  if (!modern_envelope(m, sink, &mm)) return;
  if (strcmp(method, "server/discover") == 0) {
    handle_discover(ss, m->id, sink, &mm);
    return;
  }
  if (!ss->ephemeral && !ss->modern) {
    cm_debug("this process speaks protocol revision %s from now on", mm.version);
    ss->modern = true;
  }
  if (srv_request_find(ss, m->id)) {
    srv_reply_error(sink, NULL, m->id, JSONRPC_INVALID_REQUEST,
                    "Invalid Request: a request with this id is still in flight");
    return;
  }
  if (removed_method(method)) {
    cleanup_free char *msg =
        xasprintf("Method not found: %s was removed in protocol revision %s", method, mm.version);
    srv_reply_error(sink, NULL, m->id, JSONRPC_METHOD_NOT_FOUND, msg);
    return;
  }
  if (extension_request(ss, m, sink, NULL, &mm)) return;
  if (srv_tasks_handle(ss, m, sink, NULL, &mm)) return;
  if (strcmp(method, "subscriptions/listen") == 0) {
    json_t *caps = modern_capabilities(ss->server);
    srv_listen_start(ss, m->id, m->params, sink, &mm, caps);
    json_decref(caps);
  } else if (strcmp(method, "tools/list") == 0) {
    handle_tools_list(ss, m->id, m->params, sink, NULL, &mm);
  } else if (strcmp(method, "tools/call") == 0) {
    handle_tools_call(ss, m->id, m->params, sink, NULL, &mm);
  } else if (strcmp(method, "resources/list") == 0 || strcmp(method, "resources/read") == 0 ||
             strcmp(method, "resources/templates/list") == 0) {
    handle_resources(ss, m, sink, NULL, &mm);
  } else {
    cleanup_free char *excerpt = cm_log_excerpt(method, strlen(method), 64);
    cleanup_free char *msg = xasprintf("Method not found: %s", excerpt);
    srv_reply_error(sink, NULL, m->id, JSONRPC_METHOD_NOT_FOUND, msg);
  }
}

/* Which era a single request (not a batch's element) belongs to. */
static bool request_is_modern(const srv_session_t *ss, const srv_msg_t *m) {
  if (ss->ephemeral || ss->modern) return true;
  if (ss->protocol) return false; /* pinned to the handshake era */
  return claims_modern(m) || strcmp(m->method, "server/discover") == 0;
}

static void handle_notification(srv_session_t *ss, const srv_msg_t *m) {
  if (strcmp(m->method, "notifications/initialized") == 0) {
    ss->ready = true;
  } else if (strcmp(m->method, "notifications/cancelled") == 0) {
    json_t *rid = json_is_object(m->params) ? json_object_get(m->params, "requestId") : NULL;
    if (!rid) return;
    srv_request_t *r = srv_request_find(ss, rid);
    /* Unknown or finished ids are ignored: the race with a response is allowed. */
    if (r) {
      cm_debug("request cancelled by the client");
      srv_request_cancel_one(r);
    }
  }
  /* Other notifications need nothing from us. */
}

static void handle_one(srv_session_t *ss, json_t *msg, tr_sink_t *sink, srv_batch_t *batch) {
  srv_msg_t m;
  srv_jsonrpc_classify(msg, &m);
  switch (m.kind) {
    case SRV_MSG_REQUEST:
      if (!batch && request_is_modern(ss, &m)) {
        handle_modern(ss, &m, sink);
      } else if (!batch && ss->protocol && claims_modern(&m)) {
        /* A stdio process pinned to the handshake era knows no modern request. */
        cleanup_free char *excerpt = cm_log_excerpt(m.method, strlen(m.method), 64);
        cleanup_free char *text = xasprintf(
            "Method not found: %s of protocol revision %s (this connection speaks the handshake "
            "era since its initialize)",
            excerpt, srv_modern_versions[0]);
        srv_reply_error(sink, NULL, m.id, JSONRPC_METHOD_NOT_FOUND, text);
      } else {
        handle_request(ss, &m, sink, batch);
      }
      break;
    case SRV_MSG_NOTIFICATION:
      handle_notification(ss, &m);
      break;
    case SRV_MSG_RESPONSE:
      srv_client_response(ss, msg, &m);
      break;
    default:
      srv_reply_error(sink, batch, m.id, JSONRPC_INVALID_REQUEST, m.error);
      break;
  }
}

/* The id of a single request in a text refused before it was parsed (too deep for us,
 * not for jansson), so that the error can carry it; NULL when there is none to read. */
static json_t *refused_request_id(const char *buf, size_t len) {
  json_error_t jerr;
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
  if (!root) return NULL;
  srv_msg_t m;
  srv_jsonrpc_classify(root, &m);
  json_t *id = m.kind != SRV_MSG_RESPONSE && m.id ? json_incref(m.id) : NULL;
  json_decref(root);
  return id;
}

void srv_session_handle(srv_session_t *ss, const char *buf, size_t len, tr_sink_t *reply) {
  int code;
  cleanup_free char *why = NULL;
  json_t *root = srv_jsonrpc_parse(buf, len, &code, &why);
  if (!root) {
    cleanup_free char *excerpt = cm_log_excerpt(buf, len, 80);
    cm_debug("refused message: %s: %s", why, excerpt);
    json_t *id = code == JSONRPC_INVALID_REQUEST ? refused_request_id(buf, len) : NULL;
    srv_reply_error(reply, NULL, id, code, why);
    json_decref(id);
    return;
  }
  if (json_is_array(root)) {
    if (!ss->protocol || strcmp(ss->protocol, "2025-03-26") != 0) {
      /* A batch, refused as a whole: no one id to answer with (JSON-RPC's null). */
      srv_reply_error(reply, NULL, NULL, JSONRPC_INVALID_REQUEST,
                      "Invalid Request: batches are only accepted in protocol version 2025-03-26");
    } else if (json_array_size(root) == 0) {
      srv_reply_error(reply, NULL, NULL, JSONRPC_INVALID_REQUEST, "Invalid Request: empty batch");
    } else if (json_array_size(root) > SRV_MAX_BATCH) {
      cleanup_free char *msg =
          xasprintf("Invalid Request: a batch of %zu messages exceeds the limit of %d",
                    json_array_size(root), SRV_MAX_BATCH);
      srv_reply_error(reply, NULL, NULL, JSONRPC_INVALID_REQUEST, msg);
    } else {
      srv_batch_t *batch = xcalloc(1, sizeof *batch);
      batch->sink = tr_sink_ref(reply);
      batch->responses = json_array();
      batch->bytes = 2; /* the brackets */
      batch->max_bytes = (size_t)ss->server->cfg->max_message_bytes;
      batch->pending = 1; /* held until every element is dispatched */
      size_t i;
      json_t *el;
      json_array_foreach(root, i, el) handle_one(ss, el, reply, batch);
      /* Release the hold; sends the array if every answer is already in. */
      srv_batch_release(batch);
    }
  } else {
    handle_one(ss, root, reply, NULL);
  }
  json_decref(root);
}

void srv_session_oversize(srv_session_t *ss, size_t len, tr_sink_t *reply) {
  cleanup_free char *msg =
      xasprintf("Invalid Request: message of %zu bytes exceeds the limit of %llu bytes", len,
                (unsigned long long)ss->server->cfg->max_message_bytes);
  cm_warn("%s", msg);
  srv_reply_error(reply, NULL, NULL, JSONRPC_INVALID_REQUEST, msg);
}

void srv_server_handle_stateless(srv_server_t *s, const char *principal, const char *buf,
                                 size_t len, tr_sink_t *reply) {
  /* A session of its own, for the principal's sake (what runs is owned by it), which the
   * request takes and frees when it is over; nothing of it is kept (no protocol, no log
   * level: those come with each request). */
  srv_session_t *ss = srv_session_new(s, reply);
  srv_session_set_principal(ss, principal);
  ss->ephemeral = true;
  srv_session_handle(ss, buf, len, reply);
  srv_session_release(ss);
}
