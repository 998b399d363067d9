/* GET /metrics: the Prometheus text format (version 0.0.4) of what the server counts and
 * holds.  Labels come from fixed sets only (tool, outcome, limit), never from a caller: no
 * session, run, principal or token appears, so the series cannot grow with use. */
#include <stdio.h>

#include "server/server-internal.h"

/* The environments' total size is a directory listing (envstore): kept for a while, so
 * that a scrape every few seconds does not list a large store each time. */
#define METRICS_ENV_STATS_MS 30000

static void family(cm_buf_t *b, const char *name, const char *type, const char *help) {
  cm_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(cm_buf_t *b, const char *name, uint64_t v) {
  cm_buf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

char *srv_metrics_render(srv_server_t *s, const char *http_extra) {
  const srv_counters_t *c = srv_server_counters(s);
  cm_buf_t b;
  cm_buf_init(&b, 0);

  family(&b, "mcp_sandbox_build_info", "gauge", "The server's version and sandbox backend.");
  cm_buf_printf(&b, "mcp_sandbox_build_info{version=\"%s\",backend=\"%s\"} 1\n", srv_version(),
                sbx_backend_name(srv_server_backend(s)));
  family(&b, "mcp_sandbox_start_time_seconds", "gauge", "When the server started (Unix time).");
  sample(&b, "mcp_sandbox_start_time_seconds", c->started_ms / 1000);
  family(&b, "mcp_sandbox_ready", "gauge",
         "1 once the sandbox probe passed and the interpreters are known (as /readyz).");
  sample(&b, "mcp_sandbox_ready", srv_server_ready(s));

  family(&b, "mcp_sandbox_tool_calls_total", "counter",
         "Tool calls answered, by tool and outcome.");
  for (int t = 0; t < SRV_M_TOOLS; t++)
    for (int o = 0; o < SRV_M_OUTCOMES; o++)
      cm_buf_printf(&b, "mcp_sandbox_tool_calls_total{tool=\"%s\",outcome=\"%s\"} %llu\n",
                    srv_metric_tools[t], srv_metric_outcomes[o],
                    (unsigned long long)c->calls[t][o]);
  family(&b, "mcp_sandbox_tool_call_duration_seconds", "histogram",
         "Time from a tool call's arrival to its answer, by tool.");
  for (int t = 0; t < SRV_M_TOOLS; t++) {
    uint64_t cumulative = 0;
    for (int k = 0; k <= SRV_M_BUCKETS; k++) {
      cumulative += c->duration_buckets[t][k];
      if (k < SRV_M_BUCKETS)
        cm_buf_printf(&b,
                      "mcp_sandbox_tool_call_duration_seconds_bucket{tool=\"%s\",le=\"%g\"} %llu\n",
                      srv_metric_tools[t], srv_metric_buckets[k], (unsigned long long)cumulative);
      else
        cm_buf_printf(
            &b, "mcp_sandbox_tool_call_duration_seconds_bucket{tool=\"%s\",le=\"+Inf\"} %llu\n",
            srv_metric_tools[t], (unsigned long long)cumulative);
    }
    cm_buf_printf(&b, "mcp_sandbox_tool_call_duration_seconds_sum{tool=\"%s\"} %.3f\n",
                  srv_metric_tools[t], (double)c->duration_ms_sum[t] / 1000.0);
    cm_buf_printf(&b, "mcp_sandbox_tool_call_duration_seconds_count{tool=\"%s\"} %llu\n",
                  srv_metric_tools[t], (unsigned long long)cumulative);
  }
  family(&b, "mcp_sandbox_run_limit_kills_total", "counter",
         "Runs stopped by a limit, by limit (timeout, memory, cpu, file_size, processes).");
  for (int l = 0; l < SRV_M_LIMITS; l++)
    cm_buf_printf(&b, "mcp_sandbox_run_limit_kills_total{limit=\"%s\"} %llu\n",
                  srv_metric_limits[l], (unsigned long long)c->limits[l]);

  exec_metrics_t em;
  exec_metrics(srv_server_exec(s), &em);
  family(&b, "mcp_sandbox_executions", "gauge",
         "execute_python calls in progress (from validation to the answer).");
  sample(&b, "mcp_sandbox_executions", em.total.calls);
  family(&b, "mcp_sandbox_executions_running", "gauge", "Executions holding a slot.");
  sample(&b, "mcp_sandbox_executions_running", em.total.running);
  family(&b, "mcp_sandbox_executions_starting", "gauge",
         "Runs starting (their sandbox is being set up).");
  sample(&b, "mcp_sandbox_executions_starting", em.starting);
  family(&b, "mcp_sandbox_executions_queued", "gauge", "Executions waiting for a slot.");
  sample(&b, "mcp_sandbox_executions_queued", em.total.queued);
  family(&b, "mcp_sandbox_queue_wait_seconds", "histogram",
         "How long executions waited for a slot.");
  uint64_t cumulative = 0;
  for (int k = 0; k < SRV_M_BUCKETS; k++) {
    cumulative += em.wait_buckets[k];
    cm_buf_printf(&b, "mcp_sandbox_queue_wait_seconds_bucket{le=\"%g\"} %llu\n",
                  srv_metric_buckets[k], (unsigned long long)cumulative);
  }
  cm_buf_printf(
      &b,
      "mcp_sandbox_queue_wait_seconds_bucket{le=\"+Inf\"} %llu\n"
      "mcp_sandbox_queue_wait_seconds_sum %.3f\nmcp_sandbox_queue_wait_seconds_count %llu\n",
      (unsigned long long)em.wait_count, (double)em.wait_ms_sum / 1000.0,
      (unsigned long long)em.wait_count);
  family(&b, "mcp_sandbox_prestart_ready", "gauge", "Prestarted sandboxes waiting for a call.");
  sample(&b, "mcp_sandbox_prestart_ready", em.prestart_ready);
  family(&b, "mcp_sandbox_prestart_ready_interpreters", "gauge",
         "Of the prestarted sandboxes waiting, those whose interpreter is up and waiting too.");
  sample(&b, "mcp_sandbox_prestart_ready_interpreters", em.prestart_ready_interpreters);
  family(&b, "mcp_sandbox_prestart_taken_total", "counter",
         "Runs that started in a prestarted sandbox.");
  sample(&b, "mcp_sandbox_prestart_taken_total", em.prestart_taken);
  family(&b, "mcp_sandbox_prestart_taken_interpreter_total", "counter",
         "Of those, runs whose interpreter was prestarted too.");
  sample(&b, "mcp_sandbox_prestart_taken_interpreter_total", em.prestart_taken_interpreter);
  family(&b, "mcp_sandbox_prestart_failed_total", "counter",
         "Prestarted sandboxes that ended before use or failed to start.");
  sample(&b, "mcp_sandbox_prestart_failed_total", em.prestart_failed);
  uint64_t dl_ok = 0, dl_failed = 0;
  py_registry_download_counts(srv_server_pythons(s), &dl_ok, &dl_failed);
  family(&b, "mcp_sandbox_interpreter_downloads_total", "counter",
         "Interpreter downloads (--allow-python-downloads), by result.");
  cm_buf_printf(&b,
                "mcp_sandbox_interpreter_downloads_total{result=\"ok\"} %llu\n"
                "mcp_sandbox_interpreter_downloads_total{result=\"failed\"} %llu\n",
                (unsigned long long)dl_ok, (unsigned long long)dl_failed);

  env_counters_t ec;
  env_store_counters(srv_server_envs(s), &ec);
  family(&b, "mcp_sandbox_env_cache_hits_total", "counter",
         "Calls whose dependency environment was ready.");
  sample(&b, "mcp_sandbox_env_cache_hits_total", ec.hits);
  family(&b, "mcp_sandbox_env_cache_joins_total", "counter",
         "Calls that waited for a build of their environment already in progress.");
  sample(&b, "mcp_sandbox_env_cache_joins_total", ec.joined);
  family(&b, "mcp_sandbox_env_builds_total", "counter", "Environment builds started.");
  sample(&b, "mcp_sandbox_env_builds_total", ec.builds);
  family(&b, "mcp_sandbox_env_build_failures_total", "counter", "Environment builds that failed.");
  sample(&b, "mcp_sandbox_env_build_failures_total", ec.builds_failed);
  family(&b, "mcp_sandbox_env_build_seconds_total", "counter", "Time spent building environments.");
  cm_buf_printf(&b, "mcp_sandbox_env_build_seconds_total %.3f\n", (double)ec.build_ms / 1000.0);
  family(&b, "mcp_sandbox_env_evictions_total", "counter", "Environments evicted.");
  sample(&b, "mcp_sandbox_env_evictions_total", ec.evictions);
  family(&b, "mcp_sandbox_warmup_failures_total", "counter",
         "Package cache warm-ups (the start-up download of profiles/warmup.txt) that did not "
         "complete.");
  sample(&b, "mcp_sandbox_warmup_failures_total", ec.warm_failed);
  family(&b, "mcp_sandbox_env_evicted_bytes_total", "counter",
         "Bytes of the environments evicted.");
  sample(&b, "mcp_sandbox_env_evicted_bytes_total", ec.evicted_bytes);
  uint64_t now = cm_now_ms();
  srv_assembly_t *a = srv_assembly(s);
  if (!a->metrics_env_at || now - a->metrics_env_at >= METRICS_ENV_STATS_MS) {
    env_store_stats(srv_server_envs(s), &a->metrics_envs, &a->metrics_env_bytes);
    a->metrics_env_at = now;
  }
  family(&b, "mcp_sandbox_env_cache_environments", "gauge",
         "Environments in the cache (measured at most every 30 s).");
  sample(&b, "mcp_sandbox_env_cache_environments", a->metrics_envs);
  family(&b, "mcp_sandbox_env_cache_bytes", "gauge",
         "Bytes of the environments in the cache (measured at most every 30 s).");
  sample(&b, "mcp_sandbox_env_cache_bytes", a->metrics_env_bytes);

  size_t art_files = 0;
  uint64_t art_bytes = 0;
  art_store_stats(srv_server_artifacts(s), &art_files, &art_bytes);
  family(&b, "mcp_sandbox_artifact_files", "gauge", "Output files kept for resources/read.");
  sample(&b, "mcp_sandbox_artifact_files", art_files);
  family(&b, "mcp_sandbox_artifact_bytes", "gauge", "Bytes of the output files kept.");
  sample(&b, "mcp_sandbox_artifact_bytes", art_bytes);

  family(&b, "mcp_sandbox_audit_lines_dropped_total", "counter",
         "Audit log lines lost (its queue was full or the disk refused them).");
  sample(&b, "mcp_sandbox_audit_lines_dropped_total", srv_audit_dropped(srv_server_audit(s)));
  if (http_extra) cm_buf_appends(&b, http_extra);
  return cm_buf_steal(&b);
}
