/* The prestarted sandboxes (--prestart). */
#include <sys/stat.h>

#include "server/exec/exec-internal.h"

/* Sandboxes set up ahead for the next call: bubblewrap's namespaces and mounts, the work
 * directory, the cgroup and the uid drop are done, and the supervisor waits for the go
 * (mps-sandbox-drop --wait-go).  A call that matches one takes it, writes its script into
 * its work directory and releases it: only the interpreter's start-up is left on the call's
 * path.  The next one of that shape is set up at once, beside the call.  Two shapes are
 * kept: the commonest (no dependencies, the default interpreter, the server's network
 * policy), and the last other one a call used (its dependency environment, interpreter or
 * network), so an agent that repeats a call with dependencies gets the same speed-up.
 * --prestart off turns it off. */
#define PRESTART_MAX_FAILURES 3
#define PRESTART_RETRY_MS 1000
#define PRESTART_SLOTS 2

typedef struct prestart_slot {
  exec_prestart_t *owner;
  bool used;         /* has a shape */
  py_interp_t *py;   /* the shape: interpreter, environment, network */
  env_handle_t *env; /* a copy without a lock (a held sandbox must not keep an environment
                      * from being evicted or rebuilt), and the identity of its directory
                      * when the sandbox was set up: a rebuilt one is another directory */
  dev_t env_dev;
  ino_t env_ino;
  bool network;
  sbx_run_t *run;       /* held, or NULL */
  eg_session_t *egress; /* the held sandbox's egress session, or NULL */
  char *workdir;
  bool workdir_mounted;
  unsigned failures; /* held sandboxes that died in a row; it stops trying after a few */
  cm_timer_t *timer; /* a fill is due */
} prestart_slot_t;

struct exec_prestart {
  exec_state_t *exec;
  srv_server_t *server;
  prestart_slot_t slots[PRESTART_SLOTS]; /* [0]: the commonest shape; [1]: the last other */
  void *py_wait;
  uint64_t taken;  /* calls that ran in a prestarted sandbox */
  uint64_t failed; /* held ones that ended before use, or failed to start */
};

static void prestart_fill_now(prestart_slot_t *slot);

static void slot_drop_run(prestart_slot_t *slot) {
  if (slot->run) sbx_run_free(slot->run); /* kills it: its supervisor never started anything */
  slot->run = NULL;
  eg_session_close(slot->egress);
  slot->egress = NULL;
  if (slot->workdir) exec_workdir_remove(slot->workdir, slot->workdir_mounted);
  free(slot->workdir);
  slot->workdir = NULL;
}

static void slot_clear(prestart_slot_t *slot) {
  cm_timer_cancel(slot->timer);
  slot->timer = NULL;
  slot_drop_run(slot);
  env_release(slot->env);
  slot->env = NULL;
  slot->py = NULL;
  slot->used = false;
  slot->failures = 0;
}

static void prestart_on_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  prestart_slot_t *slot = data;
  slot->timer = NULL;
  prestart_fill_now(slot);
}

static void prestart_schedule(prestart_slot_t *slot, uint64_t ms) {
  if (!slot->used || slot->timer || slot->run || slot->failures >= PRESTART_MAX_FAILURES) return;
  slot->timer = cm_loop_timer(srv_server_loop(slot->owner->server), ms, prestart_on_timer, slot);
}

/* A held sandbox died before any call took it. */
static void prestart_on_exit(void *data, const sbx_result_t *res) {
  prestart_slot_t *slot = data;
  slot->owner->failed++;
  if (++slot->failures >= PRESTART_MAX_FAILURES)
    cm_warn(
        "prestarted sandboxes keep ending before use (exit %d); not prestarting this shape any "
        "more",
        res->exit_code);
  slot_drop_run(slot); /* frees the run from inside its callback, which sbx_run allows */
  prestart_schedule(slot, PRESTART_RETRY_MS);
}

static void prestart_on_python(void *data, py_interp_t *def, const cm_error_t *error) {
  exec_prestart_t *p = data;
  p->py_wait = NULL;
  if (!def) return;
  p->slots[0].py = def;
  p->slots[0].network = srv_server_config(p->server)->network;
  p->slots[0].used = true;
  prestart_fill_now(&p->slots[0]);
}

static void prestart_fill_now(prestart_slot_t *slot) {
  srv_server_t *s = slot->owner->server;
  if (!slot->used || slot->run || slot->failures >= PRESTART_MAX_FAILURES) return;
  if (!sbx_backend_can_hold(srv_server_backend(s))) return;
  struct stat st;
  if (slot->env) {
    if (stat(slot->env->host_dir, &st) < 0)
      return; /* evicted: the next call of this shape rebuilds it */
    slot->env_dev = st.st_dev;
    slot->env_ino = st.st_ino;
  }
  cm_error_t err = CM_ERROR_INIT;
  slot->workdir = exec_workdir_make(slot->owner->exec, &slot->workdir_mounted, &err);
  sbx_run_callbacks_t cbs = {.on_exit = prestart_on_exit};
  if (!slot->workdir ||
      exec_sandbox_start(slot->owner->exec, slot->py, slot->env, slot->network, slot->workdir, 0,
                         true, &cbs, slot, &slot->run, &slot->egress, &err) < 0) {
    cm_warn("prestarting a sandbox: %s", cm_error_message(&err));
    cm_error_release(&err);
    slot->run = NULL;
    slot_drop_run(slot);
    slot->failures++;
    slot->owner->failed++;
    prestart_schedule(slot, PRESTART_RETRY_MS);
  }
}

void exec_prestart_start(srv_server_t *s) {
  exec_state_t *x = srv_server_exec(s);
  if (!srv_server_config(s)->prestart || x->prestart) return;
  exec_prestart_t *p = xcalloc(1, sizeof *p);
  p->exec = x;
  p->server = s;
  for (size_t i = 0; i < PRESTART_SLOTS; i++) p->slots[i].owner = p;
  x->prestart = p;
  /* The commonest shape needs the default interpreter: once discovery is done. */
  p->py_wait = py_registry_when_ready(srv_server_pythons(s), prestart_on_python, p);
}

void exec_prestart_free(exec_state_t *x) {
  exec_prestart_t *p = x->prestart;
  if (!p) return;
  x->prestart = NULL;
  if (p->py_wait) py_registry_cancel_wait(srv_server_pythons(x->server), p->py_wait);
  for (size_t i = 0; i < PRESTART_SLOTS; i++) slot_clear(&p->slots[i]);
  free(p);
}

void exec_prestart_counts(exec_state_t *x, size_t *ready, uint64_t *taken, uint64_t *failed) {
  exec_prestart_t *p = x->prestart;
  *ready = 0;
  *taken = p ? p->taken : 0;
  *failed = p ? p->failed : 0;
  for (size_t i = 0; p && i < PRESTART_SLOTS; i++) *ready += p->slots[i].run != NULL;
}

bool exec_prestart_describe(exec_state_t *x, uint64_t *taken) {
  exec_prestart_t *p = x->prestart;
  *taken = p ? p->taken : 0;
  return p && p->slots[0].failures < PRESTART_MAX_FAILURES &&
         sbx_backend_can_hold(srv_server_backend(x->server));
}

static bool slot_matches(const prestart_slot_t *slot, const exec_job_t *job) {
  return slot->used && slot->py == job->py && slot->network == job->spec.net.on &&
         !slot->env == !job->env && (!job->env || strcmp(slot->env->key, job->env->key) == 0);
}

static bool same_dir(const char *path, dev_t dev, ino_t ino) {
  struct stat st;
  return stat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

/* A held sandbox of the job's shape, when there is one: its run and work directory become
 * the job's (exec-internal.h).  Otherwise the job's shape becomes the second slot's (when it is not
 * the commonest), so that the next such call finds one. */
bool exec_prestart_take(exec_job_t *job) {
  exec_prestart_t *p = job->exec->prestart;
  if (!p || !p->slots[0].used || !sbx_backend_can_hold(srv_server_backend(job->server)))
    return false;
  for (size_t i = 0; i < PRESTART_SLOTS; i++) {
    prestart_slot_t *slot = &p->slots[i];
    if (!slot_matches(slot, job)) continue;
    if (slot->run && job->env && !same_dir(job->env->host_dir, slot->env_dev, slot->env_ino))
      slot_drop_run(slot); /* set up with an environment since evicted or rebuilt */
    if (!slot->run) {
      prestart_schedule(slot, 0); /* (already due, or given up on) */
      return false;
    }
    job->run = slot->run;
    job->egress = slot->egress;
    job->workdir = slot->workdir;
    job->workdir_mounted = slot->workdir_mounted;
    slot->run = NULL;
    slot->egress = NULL;
    slot->workdir = NULL;
    slot->failures = 0;
    p->taken++;
    job->prestarted = true;
    prestart_schedule(slot, 0); /* the next one, beside this call */
    return true;
  }
  prestart_slot_t *other = &p->slots[1];
  slot_clear(other);
  other->used = true;
  other->py = job->py;
  other->network = job->spec.net.on;
  other->env = job->env ? env_handle_copy_unlocked(job->env) : NULL;
  prestart_schedule(other, 0);
  return false;
}
