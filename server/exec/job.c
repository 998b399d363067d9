/* A call from its run spec to its answer: the interpreter, the sandbox's probe, a slot
 * (admission.c), the dependency environment, the work directory, the run, the result. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "server/exec/exec-internal.h"

/* ---------------------------------------------------------------- the execution state */

exec_state_t *exec_new(srv_server_t *s) {
  exec_state_t *x = xcalloc(1, sizeof *x);
  x->server = s;
  x->mount_state = -1;
  return x;
}

static void jobs_reap(exec_state_t *x);

/* The loop's deferred pass: frees what finished during the iteration (DONE jobs, DEAD
 * sessions), after every callback that may still have used it returned. */
struct exec_reap {
  exec_state_t *x; /* NULL once detached (exec_free) */
};

static void reap(void *data) {
  struct exec_reap *r = data;
  exec_state_t *x = r->x;
  free(r);
  if (!x) return;
  x->reap = NULL;
  jobs_reap(x);
  exec_sessions_reap(x);
}

void exec_reap_soon(exec_state_t *x) {
  if (x->reap) return;
  x->reap = xcalloc(1, sizeof *x->reap);
  x->reap->x = x;
  cm_loop_defer(srv_server_loop(x->server), reap, x->reap);
}

void exec_free(exec_state_t *x) {
  if (!x) return;
  exec_sessions_free(x);
  exec_prestart_free(x);
  exec_runner_release(x);
  if (x->all_jobs) cm_warn("%s: jobs are still running", __func__);
  /* (Past the shutdown's deadline only.) Their sandboxes are killed now and reaped with the
   * other detached runs (srv_server_free): none may outlive the server. */
  for (exec_job_t *job = x->all_jobs; job; job = job->all_next) {
    sbx_run_free(job->run);
    job->run = NULL;
  }
  cm_timer_cancel(x->start_gate_timer);
  /* Jobs answered since the loop's last pass (or as the server stops) are freed now; the
   * pass, if queued, finds nothing. */
  jobs_reap(x);
  if (x->reap) x->reap->x = NULL; /* (the loop frees the handle) */
  free(x);
}

void exec_wind_down(exec_state_t *x) {
  /* A job still running may take a held sandbox, or be a session's call. */
  bool idle = x->all_jobs == NULL;
  exec_prestart_stop(x, idle);
  if (idle) exec_sessions_free(x); /* (kills the kernels; never waits for them) */
}

size_t exec_teardowns(exec_state_t *x) {
  exec_prestart_counts_t pc;
  exec_prestart_counts(x, NULL, &pc);
  size_t n = pc.ready + x->n_sessions + (x->dying != NULL);
  /* (Not the DONE jobs: they hold nothing but memory, which exec_free frees too.) */
  for (exec_job_t *job = x->all_jobs; job; job = job->all_next) n++;
  return n;
}

/* ---------------------------------------------------------------- a job */

static void job_free(exec_job_t *job) {
  eg_session_close(job->egress);
  exec_spec_release(&job->spec);
  if (!job->env_borrowed) env_release(job->env);
  free(job->session_note);
  free(job->workdir);
  cm_headtail_release(&job->out);
  cm_headtail_release(&job->err);
  cm_buf_release(&job->pending);
  cm_buf_release(&job->pending_err);
  free(job);
}

void exec_job_finish(exec_job_t *job, json_t *result) {
  if (job->stage == JOB_DONE) { /* (a second end is a no-op) */
    json_decref(result);
    return;
  }
  exec_progress_stop(job);
  exec_admission_dequeue(job);
  job->stage = JOB_DONE;
  job->wait = NULL;
  srv_request_t *req = job->req;
  bool had_slot = job->holds_slot;
  job->holds_slot = false;
  /* The session's part of the answer, and the session free for its next call. */
  if (job->ksession) exec_session_job_done(job, result);
  /* The answer first: removing the work directory costs milliseconds on some disks, and
   * the next waiting script may start before it, too. */
  srv_request_finish(req, result);
  job->req = NULL; /* (may be freed: no longer counted for its session) */
  if (had_slot) {
    job->holds_slot = true;
    exec_admission_release_slot(job);
  }
  if (job->workdir && !job->ksession) {
    if (job->prestarted == EXEC_PRESTARTED_INTERPRETER)
      exec_prestart_remove_ctl(job->workdir, job->go_fd);
    exec_workdir_remove(job->workdir, job->workdir_mounted);
  }
  exec_state_t *x = job->exec;
  /* Out of the lists that find a job (its tenant's count drops); freed after this
   * iteration. */
  exec_admission_leave(job);
  job->done_next = x->done_jobs;
  x->done_jobs = job;
  exec_reap_soon(x);
  exec_prestart_call_done(x); /* a refill deferred until a call was answered */
}

static void jobs_reap(exec_state_t *x) {
  while (x->done_jobs) {
    exec_job_t *job = x->done_jobs;
    x->done_jobs = job->done_next;
    job_free(job);
  }
}

static void job_advance(exec_job_t *job);

/* ---------------------------------------------------------------- completions */

/* Each completion forgets what it waited for and hands over to job_advance, or ends the job
 * on an error. */

static void on_python(void *data, py_interp_t *def, const cm_error_t *def_error) {
  exec_job_t *job = data;
  job->wait = NULL;
  job_advance(job);
}

static void on_downloaded(void *data, const cm_error_t *error) {
  exec_job_t *job = data;
  if (error) {
    exec_job_finish(job, srv_tool_error_result("%s", cm_error_message(error)));
    return;
  }
  job_advance(job);
}

/* The sandbox must be probed before anything runs in it (environment builds included):
 * until then the job waits, and the loop serves others. */
static void on_probed(void *data) {
  exec_job_t *job = data;
  job->wait = NULL;
  job_advance(job);
}

static void on_env_progress(void *data, const char *message, size_t len) {
  exec_job_t *job = data;
  job->setup_progress += 1;
  srv_request_progress(job->req, job->setup_progress, message, len, NULL);
}

static void on_env(void *data, env_handle_t *env, const cm_error_t *error) {
  exec_job_t *job = data;
  job->wait = NULL;
  if (!env) {
    exec_job_finish(
        job, srv_tool_error_result(
                 "%s", error ? cm_error_message(error) : "The environment could not be built."));
    return;
  }
  job->env = env;
  job_advance(job);
}

static void on_output(void *data, sbx_stream_t stream, const char *buf, size_t len) {
  exec_job_t *job = data;
  cm_headtail_append(stream == SBX_STDOUT ? &job->out : &job->err, buf, len);
  exec_progress_output(job, stream, buf, len);
}

static void audit_run(exec_job_t *job, const sbx_result_t *res);

static void on_exit_cb(void *data, const sbx_result_t *res) {
  exec_job_t *job = data;
  sbx_run_free(job->run);
  job->run = NULL;
  /* The run is over: so are its connections (what they did is counted in the session). */
  sbx_backend_t *nb = srv_server_backend(job->server);
  cleanup_json json_t *network = srv_network_result(job->cfg, nb, &job->spec.net, job->egress);
  cm_buf_t net_text;
  cm_buf_init(&net_text, 0);
  srv_network_text(job->cfg, nb, &job->spec.net, job->egress, &net_text);
  if (job->spec.secrets.n) {
    srv_secrets_text(job->cfg, &job->spec.secrets, &job->spec.net, job->egress, &net_text);
    /* Names only: which of the call's secrets went out in place of their placeholders. */
    json_t *used = srv_secrets_used(job->cfg, &job->spec.secrets, job->egress);
    srv_request_audit(job->req, "secrets_used", json_copy(used));
    json_object_set_new(network, "secrets_used", used);
  }
  eg_session_close(job->egress);
  job->egress = NULL;
  if (srv_request_cancelled(job->req)) {
    cm_buf_release(&net_text);
    exec_job_finish(job, json_object());
    return;
  }
  if (job->pending.len || job->skipped) exec_progress_flush(job);
  audit_run(job, res);
  json_t *result = exec_output_result(job, res, steal_pointer(&network), &net_text);
  cm_buf_release(&net_text);
  exec_job_finish(job, result);
}

/* ---------------------------------------------------------------- the stages' work */

/* JOB_PYTHON: the interpreter of the call (the session's, the one asked for, the default).
 * Returns false when the job moved elsewhere: to JOB_DOWNLOAD, or finished. */
static bool choose_python(exec_job_t *job) {
  py_registry_t *reg = srv_server_pythons(job->server);
  py_interp_t *session_py = job->ksession ? exec_session_python(job->ksession) : NULL;
  cleanup_error cm_error_t why = CM_ERROR_INIT;
  py_interp_t *py =
      session_py && !job->spec.python_request
          ? session_py
          : py_registry_select(reg, job->spec.python_request, job->spec.requires_python, &why);
  if (session_py && py && py != session_py) {
    exec_job_finish(job, srv_tool_error_result(
                             "This session runs Python %s; python_version %s would need a kernel "
                             "of another interpreter. Start a new session for it.",
                             session_py->version, job->spec.python_request));
    return false;
  }
  if (!py && why.kind == CM_ERR_NOT_FOUND && !job->download_tried &&
      py_registry_can_download(reg) && (job->spec.python_request || job->spec.requires_python)) {
    /* --allow-python-downloads: uv installs what was asked for, then we choose again. */
    const char *want =
        job->spec.python_request ? job->spec.python_request : job->spec.requires_python;
    job->download_tried = true;
    cm_error_t err = CM_ERROR_INIT;
    cleanup_free char *msg = xasprintf("downloading Python %s with uv", want);
    job->setup_progress += 1;
    srv_request_progress(job->req, job->setup_progress, msg, strlen(msg), NULL);
    job->stage = JOB_DOWNLOAD;
    if (py_registry_download(reg, want, on_downloaded, job, &err) == 0) return false;
    exec_job_finish(job, srv_tool_error_result("%s (and it could not be downloaded: %s)",
                                               cm_error_message(&why), cm_error_message(&err)));
    cm_error_release(&err);
    return false;
  }
  if (!py) {
    exec_job_finish(job, srv_tool_error_result(
                             "%s", why.msg ? why.msg : "No Python interpreter is available."));
    return false;
  }
  job->py = py;
  return true;
}

/* JOB_PROBE: true once the backend is probed and available; false while the job waits for
 * the probe, or when it finished (no sandbox: the server never runs without one). */
static bool sandbox_ready(exec_job_t *job) {
  if (!srv_server_probed(job->server)) {
    job->wait = srv_server_when_probed(job->server, on_probed, job);
    return false;
  }
  sbx_backend_t *b = srv_server_backend(job->server);
  if (!b->available) {
    exec_job_finish(job,
                    srv_tool_error_result(
                        "The %s sandbox is not available on this server, so the script was not run "
                        "(the server never falls back to running without a sandbox): %s",
                        sbx_backend_name(b), b->unavailable ? b->unavailable : "unknown reason"));
    return false;
  }
  return true;
}

/* JOB_ENV: true when the environment is ready (the session's, or none is needed); false
 * while the job waits for env_store_ensure's answer (cached or built). */
static bool env_ready(exec_job_t *job) {
  if (job->ksession && exec_session_prepare(job)) return true;
  if (job->spec.n_requirements == 0) return true;
  /* The answer comes from the loop, never from inside this call (envstore.h), so job is
   * still alive to hold the handle. */
  job->wait = env_store_ensure(srv_server_envs(job->server), job->py, job->spec.requirements,
                               job->spec.n_requirements, job->spec.uv_config, job->spec.principal,
                               on_env, on_env_progress, job);
  return false;
}

static int write_job_files(exec_job_t *job, cm_error_t *err) {
  cleanup_free char *script_path = xasprintf("%s/script.py", job->workdir);
  if (cm_write_file(script_path, job->spec.script, job->spec.script_len, 0644, err) < 0)
    return cm_error_wrap(err, "Cannot prepare the run");
  if (job->spec.inputs.n) {
    cleanup_close int wfd = open(job->workdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (wfd < 0)
      return cm_error_set(err, errno, CM_ERR_IO,
                          "Cannot write the input files: opening the work directory");
    if (files_write_inputs(wfd, &job->spec.inputs, err) < 0)
      return cm_error_wrap(err, "Cannot write the input files");
    files_inputs_release(&job->spec.inputs); /* on disk now: no need to hold them during the run */
  }
  return 0;
}

/* JOB_WORKDIR -> JOB_RUNNING: the work directory and its files, then the run (a prestarted
 * one when there is one of the job's shape).  Ends the job when that fails. */
static void start_run(exec_job_t *job) {
  cm_error_t err = CM_ERROR_INIT;
  sbx_run_callbacks_t cbs = {.on_output = on_output, .on_exit = on_exit_cb};
  if (exec_prestart_take(job)) {
    /* The call's own list narrows the session, then its egress opens (it had none while
     * held: what the interpreter's set-up opened is closed now), all before the go. */
    if (job->egress && job->spec.net.rules)
      eg_session_narrow(job->egress, job->spec.net.rules, job->spec.net.n_rules);
    if (job->egress) eg_session_open(job->egress);
    /* Released first: the script's output and its timeout are the job's from its first
     * instruction. */
    bool warm = job->prestarted == EXEC_PRESTARTED_INTERPRETER;
    if (write_job_files(job, &err) == 0 &&
        sbx_run_release(job->run, &cbs, job, job->spec.timeout_ms, &err) == 0 &&
        (!warm || exec_prestart_go(job, &err) == 0)) {
      job->stage = JOB_RUNNING;
      /* Nothing CPU-heavy is left of its start: the next call need not wait for it. */
      if (warm) exec_admission_started(job);
      return;
    }
    /* It died meanwhile (or the files could not be written): do it the long way. */
    cm_debug("prestarted sandbox not used: %s", cm_error_message(&err));
    cm_error_release(&err);
    sbx_run_free(job->run);
    job->run = NULL;
    eg_session_close(job->egress);
    job->egress = NULL;
    if (warm) exec_prestart_remove_ctl(job->workdir, job->go_fd);
    job->go_fd = -1;
    exec_workdir_remove(job->workdir, job->workdir_mounted);
    free(job->workdir);
    job->workdir = NULL;
    job->prestarted = EXEC_PRESTARTED_NO;
  }
  job->workdir = exec_workdir_make(job->exec, &job->workdir_mounted, &err);
  if (!job->workdir || write_job_files(job, &err) < 0) {
    exec_job_finish(job, job->workdir ? srv_tool_error_result("%s", cm_error_message(&err))
                                      : srv_tool_error_result("Cannot prepare the run: %s",
                                                              cm_error_message(&err)));
    cm_error_release(&err);
    return;
  }
  if (exec_sandbox_start(job->exec, job->py, job->env, job->spec.net.on, job->workdir,
                         job->spec.timeout_ms, false, &job->spec.secrets, &cbs, job, &job->run,
                         &job->egress, &err) < 0) {
    exec_job_finish(job, srv_tool_error_result("The sandbox could not start the script: %s",
                                               cm_error_message(&err)));
    cm_error_release(&err);
    return;
  }
  job->stage = JOB_RUNNING;
  /* Before the loop runs again, so before any connection of the script reaches the proxy. */
  if (job->egress && job->spec.net.rules)
    eg_session_narrow(job->egress, job->spec.net.rules, job->spec.net.n_rules);
}

/* ---------------------------------------------------------------- the driver */

/* The job's one driver: the current stage's work is done (its completion called this), so
 * the job moves on, doing each next stage's work until one has to wait (its completion
 * calls this again) or the job is finished (DONE: its memory stays until the loop's
 * deferred pass, but nothing may act on it after a stage's work that may finish it). */
static void job_advance(exec_job_t *job) {
  switch (job->stage) {
    case JOB_DOWNLOAD: /* the download is done: choose again */
      job->stage = JOB_PYTHON;
      /* fall through */
    case JOB_PYTHON: /* the interpreters are known */
      if (!choose_python(job)) return;
      job->stage = JOB_PROBE;
      /* fall through */
    case JOB_PROBE:
      if (!sandbox_ready(job)) return;
      job->stage = JOB_QUEUED;
      exec_admission_enqueue(job); /* may start (exec_job_start) and even finish the job */
      return;
    case JOB_QUEUED: /* admitted: it holds a slot */
      job->stage = JOB_ENV;
      if (!env_ready(job)) return;
      /* fall through */
    case JOB_ENV: /* the environment is ready (or none is needed) */
      job->stage = JOB_WORKDIR;
      /* Script output progress continues from where environment progress stopped. */
      job->streamed = (uint64_t)job->setup_progress;
      if (job->ksession) {
        /* The session's kernel runs it (its work directory is the session's). */
        job->stage = JOB_RUNNING;
        exec_session_run(job); /* may finish the job */
        return;
      }
      start_run(job); /* may finish the job */
      return;
    case JOB_WORKDIR:
    case JOB_RUNNING:
    case JOB_DONE:
      /* (Not reached: the run's end finishes the job, and nothing moves a finished one.) */
      return;
  }
}

void exec_job_start(exec_job_t *job) {
  job_advance(job);
}

/* notifications/cancelled: what the job stops depends on where it is. */
static void on_cancel(void *data) {
  exec_job_t *job = data;
  py_registry_t *reg = srv_server_pythons(job->server);
  switch (job->stage) {
    case JOB_PYTHON:
      if (job->wait) py_registry_cancel_wait(reg, job->wait);
      break;
    case JOB_DOWNLOAD:
      py_registry_cancel_download(reg);
      break;
    case JOB_PROBE:
      if (job->wait) srv_server_cancel_probe_wait(job->server, job->wait);
      break;
    case JOB_QUEUED: /* exec_job_finish takes it out of the queue */
      break;
    case JOB_ENV:
      if (job->wait) env_store_cancel(srv_server_envs(job->server), job->wait);
      break;
    case JOB_WORKDIR: /* (its work never waits: not reached) */
      break;
    case JOB_RUNNING:
      if (job->run) {
        sbx_run_cancel(job->run); /* on_exit_cb follows and finishes */
        return;
      }
      if (job->ksession && exec_session_cancel(job)) return; /* the session ends the job */
      break;
    case JOB_DONE:
      return;
  }
  job->wait = NULL;
  exec_job_finish(job, json_object());
}

/* ---------------------------------------------------------------- submitting a spec */

/* What the audit line of an execute_python call says of it (--audit-log): the script by its
 * digest and size (never its text), its requirements, the Python asked for, the network. */
static void audit_call(srv_request_t *r, const exec_spec_t *spec, const srv_config_t *cfg) {
  char digest[65];
  cm_sha256_hex(spec->script, spec->script_len, digest);
  srv_request_audit(r, "script_sha256", json_string(digest));
  srv_request_audit(r, "script_bytes", json_integer((json_int_t)spec->script_len));
  json_t *reqs = json_array();
  for (size_t i = 0; i < spec->n_requirements; i++)
    json_array_append_new(reqs, json_string(spec->requirements[i]));
  srv_request_audit(r, "requirements", reqs);
  if (spec->python_request)
    srv_request_audit(r, "python_request", json_string(spec->python_request));
  srv_request_audit(r, "network",
                    json_string(!spec->net.on       ? "off"
                                : cfg->network_host ? "host"
                                                    : "policy"));
  srv_request_audit(r, "timeout_ms", json_integer((json_int_t)spec->timeout_ms));
}

/* ... and of its run. */
static void audit_run(exec_job_t *job, const sbx_result_t *res) {
  srv_request_t *r = job->req;
  srv_request_audit(r, "sandbox", json_string(sbx_backend_name(srv_server_backend(job->server))));
  if (job->py) srv_request_audit(r, "python", json_string(job->py->version));
  if (job->env) {
    srv_request_audit(r, "environment", json_string(job->env->key));
    srv_request_audit(r, "environment_cached", json_boolean(job->env->cached));
  }
  srv_request_audit(r, "exit_code", json_integer(res->exit_code));
  const char *limit = res->timed_out         ? "timeout"
                      : res->memory_limit    ? "memory"
                      : res->cpu_limit       ? "cpu"
                      : res->file_size_limit ? "file_size"
                      : res->process_limit   ? "processes"
                                             : NULL;
  if (limit) srv_request_note_limit(r, limit);
  srv_request_audit(r, "run_ms", json_integer((json_int_t)res->duration_ms));
  srv_request_audit(r, "cpu_ms", json_integer((json_int_t)(res->cpu_user_ms + res->cpu_system_ms)));
  uint64_t peak = res->memory_peak_bytes ? res->memory_peak_bytes : res->max_rss_kib * 1024;
  srv_request_audit(r, "memory_peak_bytes", json_integer((json_int_t)peak));
  srv_request_audit(r, "stdout_bytes", json_integer((json_int_t)job->out.total));
  srv_request_audit(r, "stderr_bytes", json_integer((json_int_t)job->err.total));
}

void exec_submit(srv_request_t *r, exec_spec_t *spec) {
  srv_server_t *s = srv_request_server(r);
  exec_state_t *x = srv_server_exec(s);
  const srv_config_t *cfg = srv_server_config(s);
  srv_session_t *session = srv_request_session(r);
  json_t *refusal = exec_admission_refusal(x, session, spec->principal);
  exec_session_t *ks = NULL;
  char *session_note = NULL;
  if (!refusal && spec->session) refusal = exec_session_claim(x, spec, &ks, &session_note);
  if (refusal) {
    exec_spec_release(spec);
    srv_request_finish(r, refusal);
    return;
  }
  audit_call(r, spec, cfg);
  exec_job_t *job = xcalloc(1, sizeof *job);
  job->spec = *spec;
  memset(spec, 0, sizeof *spec); /* the job's now */
  job->req = r;
  job->server = s;
  job->exec = x;
  job->cfg = cfg;
  job->go_fd = -1;
  job->ksession = ks;
  job->session_note = session_note;
  exec_admission_join(job);
  cm_headtail_init(&job->out, cfg->max_output_bytes, cfg->max_output_bytes);
  cm_headtail_init(&job->err, cfg->max_output_bytes, cfg->max_output_bytes);
  cm_buf_init(&job->pending, EXEC_PROGRESS_MAX_TEXT + 16);
  cm_buf_init(&job->pending_err, EXEC_PROGRESS_MAX_TEXT + 16);
  srv_request_on_cancel(r, on_cancel, job);
  job->stage = JOB_PYTHON;
  job->wait = py_registry_when_ready(srv_server_pythons(s), on_python, job);
}
