/* The prestarted sandboxes and interpreters (--prestart). */
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/exec/exec-internal.h"

/* Sandboxes set up ahead for the next calls, kept per shape (interpreter, dependency
 * environment, network).  Where the interpreter can be held (CPython 3.8 or later on a
 * backend that runs the host's interpreter), each one's interpreter is already up too: the
 * start-up runner (profiles/runner.py --mps-warm) has initialised (site, the environment's
 * paths, the runner itself; never a user module) and blocks on a FIFO of its own, in a
 * directory mounted read-only at EXEC_KERNEL_CTL_TARGET, the session kernel's channel.  A
 * call that matches takes one, writes its input files and script into its work directory,
 * releases the run (its timeout counts from then) and writes the go, one kframe.c frame
 * naming the script: only compiling and running the script is left on the call's path.
 * Other interpreters (PyPy, older CPython, an image's) get today's held sandbox: the
 * supervisor waits for the go (mps-sandbox-drop --wait-go) and the interpreter starts on
 * the call's path.
 *
 * Each one serves exactly one call, with its own uid, /tmp, work directory and cgroup, its
 * limits in force from the interpreter's first instruction (so before the script's).  Its
 * network (when the shape has one) has no way out until the go (EG_SESSION_HELD): the
 * interpreter's set-up (site, every .pth of the environment) reaches nothing, holds none of
 * the proxy's connections, and the call's own list narrows the session before it opens
 * (job.c), so a call's `network` list is never part of the shape.  The
 * pool keeps --prestart N of each shape (on: SRV_PRESTART_DEFAULT); a call that takes one
 * starts its replacement at once, beside the call.  The commonest shape (no dependencies, the
 * default interpreter, the server's network policy) is kept for every principal: it reveals
 * nothing but the server's defaults.  Besides, each principal has the last other shape one of
 * its calls used, so an agent that repeats a call with dependencies gets the same speed-up
 * (one of it until a call takes it: a shape used once costs one set-up, not N).  That shape
 * is its own: only its calls take from it, only its calls replace it, and check_environment
 * shows it to it alone (another tenant's interpreter, environment key and network are its
 * business; a call of another shape must not evict them and keep its calls cold).  At most
 * PRESTART_PRINCIPALS principals keep one; a newcomer's replaces the one used least recently.
 * --prestart off turns it off.
 *
 * One that dies before a call takes it (killed from outside, say) is replaced after
 * PRESTART_RETRY_MS; after PRESTART_MAX_FAILURES of a shape's in a row (times N) its
 * interpreters are no longer held (today's held sandbox instead), and after as many of
 * those, nothing of that shape is prestarted any more. */
#define PRESTART_MAX_FAILURES 3
#define PRESTART_RETRY_MS 1000
/* While calls wait (exec_admission_busy), a refill looks again this much later. */
#define PRESTART_BUSY_MS 10
/* At most one set-up per start gate place (--max-starting) in this long: a pool grown by a
 * burst refills at about the rate the machine sets them up, not all at once. */
#define PRESTART_STAGGER_MS 25
/* A pool grown by misses shrinks by half (to --prestart N at least) after this long without
 * one. */
#define PRESTART_SHRINK_MS 60000
/* A call that took one of several ready defers its replacement until a call was answered
 * (exec_prestart_call_done), or this long: the loop's part of a set-up, beside a short call,
 * would delay that call's answer. */
#define PRESTART_DEFER_MS 200
/* The server's descriptors a held sandbox keeps (pipes, pidfd, status and control channels,
 * its FIFO, its egress socket: about 7), rounded up.  The pool grows only within a quarter of
 * RLIMIT_NOFILE (all shapes together): the rest is for calls, connections and egress, and a
 * pool that took them all would fail its own refills and refuse cold calls with EMFILE. */
#define PRESTART_FDS_PER_HELD 8
/* The principals that keep a last other shape (each held sandbox costs memory: a few MiB of
 * interpreter and a sandbox's processes). */
#define PRESTART_PRINCIPALS 4
#define PRESTART_SLOTS (1 + PRESTART_PRINCIPALS)
/* The oldest CPython the runner's wait is written for (and tested on). */
#define PRESTART_MIN_MAJOR 3
#define PRESTART_MIN_MINOR 8

typedef struct prestart_slot prestart_slot_t;

/* One held sandbox (and interpreter). */
typedef struct prestart_held {
  prestart_slot_t *slot;
  sbx_run_t *run;       /* held, or NULL */
  eg_session_t *egress; /* its egress session, or NULL */
  char *workdir;
  bool workdir_mounted;
  bool warm;      /* the interpreter waits on go_fd's FIFO (in workdir.ctl/) */
  int go_fd;      /* the server's end of that FIFO (O_RDWR), or -1 */
  uint64_t since; /* when it was started (ms): a call takes the oldest, the likeliest to be up */
  dev_t env_dev;  /* the identity of the environment's directory when it was set up: a */
  ino_t env_ino;  /* rebuilt one is another directory */
} prestart_held_t;

struct prestart_slot {
  exec_prestart_t *owner;
  bool used;         /* has a shape */
  py_interp_t *py;   /* the shape: interpreter, environment, network */
  env_handle_t *env; /* a copy without a lock (a held sandbox must not keep an environment
                      * from being evicted or rebuilt) */
  bool network;
  bool warm;             /* its interpreters can be held (and have not failed) */
  prestart_held_t *held; /* [owner->max_held] */
  size_t target;         /* how many of held to keep: per_shape, or 1 for a last other shape
                          * no call has taken one of yet; more after misses (up to max_held) */
  uint64_t last_miss;    /* when a call of the shape last found none ready (ms) */
  char *principal;       /* whose last other shape it is; NULL: the commonest (everyone's) */
  uint64_t last_used;    /* when its principal's call set the shape or took one (ms): of the
                          * others, the least recently used is replaced first */
  unsigned failures;     /* held ones that died in a row */
  cm_timer_t *timer;     /* a fill is due */
  bool deferred;         /* ... and it waits for a call to be answered (PRESTART_DEFER_MS) */
};

struct exec_prestart {
  exec_state_t *exec;
  srv_server_t *server;
  size_t per_shape;   /* --prestart N */
  size_t max_held;    /* --prestart-max (at least N): what a shape's pool may grow to */
  cm_timer_t *shrink; /* a grown pool is due to be looked at */
  uint64_t shrink_ms; /* PRESTART_SHRINK_MS, but for tests */
  /* [0]: the commonest shape; [1..]: a principal's last other shape each */
  prestart_slot_t slots[PRESTART_SLOTS];
  void *py_wait;
  uint64_t taken;      /* calls that ran in a prestarted sandbox */
  uint64_t taken_warm; /* of those, in a prestarted interpreter */
  uint64_t failed;     /* held ones that ended before use, or failed to start */
};

static void prestart_fill_now(prestart_slot_t *slot);

/* The FIFO directory of a held interpreter: next to its work directory, so that whatever
 * sweeps the server's runs directory sweeps it too. */
static char *ctl_dir_of(const char *workdir) {
  return xasprintf("%s.ctl", workdir);
}

void exec_prestart_remove_ctl(const char *workdir, int go_fd) {
  if (go_fd >= 0) close(go_fd);
  cleanup_free char *ctl = ctl_dir_of(workdir);
  exec_workdir_remove(ctl, false); /* (in the background, as the work directory) */
}

static void held_drop(prestart_held_t *h) {
  if (h->run) sbx_run_free(h->run); /* kills it: it never ran anything of a call's */
  h->run = NULL;
  eg_session_close(h->egress);
  h->egress = NULL;
  if (h->workdir) {
    if (h->warm) exec_prestart_remove_ctl(h->workdir, h->go_fd);
    exec_workdir_remove(h->workdir, h->workdir_mounted);
  }
  free(h->workdir);
  h->workdir = NULL;
  h->warm = false;
  h->go_fd = -1;
}

static size_t slot_ready(const prestart_slot_t *slot) {
  size_t n = 0;
  for (size_t i = 0; slot->held && i < slot->owner->max_held; i++) n += slot->held[i].run != NULL;
  return n;
}

static unsigned max_failures(const prestart_slot_t *slot) {
  return PRESTART_MAX_FAILURES * (unsigned)slot->owner->per_shape;
}

static bool slot_given_up(const prestart_slot_t *slot) {
  return !slot->warm && slot->failures >= max_failures(slot);
}

/* Whether py's interpreter can be held on this server: CPython from 3.8 on, the host's own
 * (so the runner's wait is the one tested here), with the runner found. */
static bool can_hold_interpreter(exec_state_t *x, const py_interp_t *py) {
  sbx_backend_t *b = srv_server_backend(x->server);
  if (!sbx_backend_host_processes(b) || !exec_runner_path(x)) return false;
  if (!py->implementation || strcasecmp(py->implementation, "cpython") != 0) return false;
  unsigned major = 0, minor = 0;
  if (!py->version || sscanf(py->version, "%u.%u", &major, &minor) != 2) return false;
  return major > PRESTART_MIN_MAJOR || (major == PRESTART_MIN_MAJOR && minor >= PRESTART_MIN_MINOR);
}

static void slot_clear(prestart_slot_t *slot) {
  cm_timer_cancel(slot->timer);
  slot->timer = NULL;
  slot->deferred = false;
  for (size_t i = 0; slot->held && i < slot->owner->max_held; i++) held_drop(&slot->held[i]);
  env_release(slot->env);
  slot->env = NULL;
  slot->py = NULL;
  slot->used = false;
  slot->failures = 0;
  free(slot->principal);
  slot->principal = NULL;
}

static void slot_set_shape(prestart_slot_t *slot, const char *principal, py_interp_t *py,
                           env_handle_t *env, bool network) {
  slot->used = true;
  slot->principal = principal ? xstrdup(principal) : NULL;
  slot->last_used = cm_now_ms();
  slot->py = py;
  slot->env = env;
  slot->network = network;
  slot->warm = can_hold_interpreter(slot->owner->exec, py);
  slot->failures = 0;
  /* The last other shape may be a one-off: one is kept until a call takes it, then N. */
  slot->target = slot == &slot->owner->slots[0] ? slot->owner->per_shape : 1;
}

static void prestart_on_timer(cm_loop_t *loop, cm_timer_t *t, void *data) {
  prestart_slot_t *slot = data;
  slot->timer = NULL;
  slot->deferred = false;
  prestart_fill_now(slot);
}

static void prestart_schedule(prestart_slot_t *slot, uint64_t ms) {
  if (slot->owner->exec->prestart_stopped || !slot->used || slot->timer || slot_given_up(slot) ||
      slot_ready(slot) >= slot->target)
    return;
  slot->timer = cm_loop_timer(srv_server_loop(slot->owner->server), ms, prestart_on_timer, slot);
}

static void slot_failed(prestart_slot_t *slot) {
  slot->owner->failed++;
  if (++slot->failures < max_failures(slot)) return;
  if (slot->warm) {
    cm_warn(
        "prestarted interpreters of Python %s keep ending before use; its sandboxes are "
        "prestarted without the interpreter from now on",
        slot->py->version);
    slot->warm = false;
    slot->failures = 0;
    /* The held ones still waiting are of the kind that fails: set up again without. */
    for (size_t i = 0; i < slot->owner->max_held; i++) held_drop(&slot->held[i]);
    return;
  }
  cm_warn("prestarted sandboxes keep ending before use; not prestarting this shape any more");
}

static void prestart_on_shrink(cm_loop_t *loop, cm_timer_t *t, void *data) {
  exec_prestart_t *p = data;
  p->shrink = NULL;
  uint64_t now = cm_now_ms();
  bool again = false;
  for (size_t i = 0; i < PRESTART_SLOTS; i++) {
    prestart_slot_t *slot = &p->slots[i];
    if (slot->used && slot->target > p->per_shape && now >= slot->last_miss + p->shrink_ms) {
      slot->target = CM_MAX(p->per_shape, slot->target / 2);
      /* Those beyond it go, the newest first (the oldest are the likeliest to be up). */
      while (slot_ready(slot) > slot->target) {
        prestart_held_t *newest = NULL;
        for (size_t j = 0; j < p->max_held; j++)
          if (slot->held[j].run && (!newest || slot->held[j].since > newest->since))
            newest = &slot->held[j];
        held_drop(newest);
      }
    }
    again |= slot->used && slot->target > p->per_shape;
  }
  if (again) p->shrink = cm_loop_timer(loop, p->shrink_ms, prestart_on_shrink, p);
}

/* How many sandboxes all shapes together may hold: those that fit in a quarter of
 * RLIMIT_NOFILE, but --prestart N for the commonest shape and one other at least (as when
 * there was one other shape).  Looked up each time: the soft limit may be raised after the
 * start. */
static size_t held_budget(const exec_prestart_t *p) {
  struct rlimit rl;
  size_t budget = SIZE_MAX;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    budget = (size_t)(rl.rlim_cur / 4 / PRESTART_FDS_PER_HELD);
  return CM_MAX(budget, 2 * p->per_shape);
}

/* How far a shape's pool may grow: --prestart-max, within half the budget (the commonest
 * shape and the others share it), at least --prestart N. */
static size_t grow_cap(const exec_prestart_t *p) {
  return CM_MAX(p->per_shape, CM_MIN(p->max_held, held_budget(p) / 2));
}

/* Whether one more of slot's fits in the budget.  The commonest shape's pool is bounded by
 * grow_cap (half the budget); the principals' last other shapes share what it leaves. */
static bool within_budget(const prestart_slot_t *slot) {
  const exec_prestart_t *p = slot->owner;
  if (slot == &p->slots[0]) return true;
  size_t held = CM_MAX(p->slots[0].target, slot_ready(&p->slots[0]));
  for (size_t i = 1; i < PRESTART_SLOTS; i++) held += slot_ready(&p->slots[i]);
  return held < held_budget(p);
}

/* A call of the shape found none ready: the pool is smaller than the bursts of calls it
 * gets.  It grows by one per such call, up to --prestart-max, and shrinks back by half after
 * PRESTART_SHRINK_MS without one (prestart_on_shrink). */
static void slot_missed(prestart_slot_t *slot) {
  exec_prestart_t *p = slot->owner;
  slot->last_miss = cm_now_ms();
  if (slot->target >= grow_cap(p) || slot->target < p->per_shape) return;
  slot->target++;
  if (!p->shrink)
    p->shrink = cm_loop_timer(srv_server_loop(p->server), p->shrink_ms, prestart_on_shrink, p);
}

/* A held sandbox died before any call took it. */
static void prestart_on_exit(void *data, const sbx_result_t *res) {
  prestart_held_t *h = data;
  prestart_slot_t *slot = h->slot;
  cm_debug("a prestarted %s ended before use (exit %d)", h->warm ? "interpreter" : "sandbox",
           res->exit_code);
  held_drop(h); /* frees the run from inside its callback, which sbx_run allows */
  slot_failed(slot);
  prestart_schedule(slot, PRESTART_RETRY_MS);
}

static void prestart_on_python(void *data, py_interp_t *def, const cm_error_t *error) {
  exec_prestart_t *p = data;
  p->py_wait = NULL;
  if (!def) return;
  slot_set_shape(&p->slots[0], NULL, def, NULL, srv_server_config(p->server)->network);
  prestart_fill_now(&p->slots[0]);
}

/* The FIFO of a held interpreter, in workdir.ctl/ (read and searched by its uid, which opens
 * it by name): the server keeps its end open (O_RDWR) from before the interpreter starts to
 * the call's end, so the go written into it waits there however late the interpreter opens
 * it. */
static int make_go_fifo(const char *workdir, int *fd, cm_error_t *err) {
  cleanup_free char *ctl = ctl_dir_of(workdir);
  if (mkdir(ctl, 0700) < 0) return cm_error_set(err, errno, CM_ERR_IO, "creating %s", ctl);
  cleanup_free char *path = xasprintf("%s/go", ctl);
  if (mkfifo(path, 0600) < 0 || chmod(path, 0666) < 0 || chmod(ctl, 0711) < 0)
    return cm_error_set(err, errno, CM_ERR_IO, "creating the FIFO %s", path);
  *fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (*fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "opening the FIFO %s", path);
  return 0;
}

static int held_start(prestart_slot_t *slot, prestart_held_t *h, cm_error_t *err) {
  exec_prestart_t *p = slot->owner;
  h->slot = slot;
  h->go_fd = -1;
  h->warm = false;
  h->since = cm_now_ms();
  h->workdir = exec_workdir_make(p->exec, &h->workdir_mounted, err);
  if (!h->workdir) return -1;
  if (slot->env) {
    struct stat st;
    if (stat(slot->env->host_dir, &st) < 0)
      return cm_error_set(err, errno, CM_ERR_IO, "the environment %s is gone", slot->env->key);
    h->env_dev = st.st_dev;
    h->env_ino = st.st_ino;
  }
  sbx_run_callbacks_t cbs = {.on_exit = prestart_on_exit};
  if (slot->warm) {
    h->warm = true; /* from here on, held_drop removes workdir.ctl too */
    if (make_go_fifo(h->workdir, &h->go_fd, err) < 0) return -1;
    cleanup_free char *ctl = ctl_dir_of(h->workdir);
    return exec_sandbox_start_warm(p->exec, slot->py, slot->env, slot->network, h->workdir, ctl,
                                   &cbs, h, &h->run, &h->egress, err);
  }
  return exec_sandbox_start(p->exec, slot->py, slot->env, slot->network, h->workdir, 0, true, NULL,
                            &cbs, h, &h->run, &h->egress, err);
}

static void prestart_fill_now(prestart_slot_t *slot) {
  srv_server_t *s = slot->owner->server;
  if (slot->owner->exec->prestart_stopped || !slot->used || slot_given_up(slot)) return;
  if (!sbx_backend_can_hold(srv_server_backend(s))) return;
  if (slot->env && access(slot->env->host_dir, F_OK) < 0)
    return; /* evicted: the next call of this shape rebuilds it */
  /* Calls come first: one waits for a slot or the start gate is full, and a set-up now
   * would take CPU from it for a later call's sake. */
  exec_state_t *x = slot->owner->exec;
  if (exec_admission_busy(x)) {
    prestart_schedule(slot, PRESTART_BUSY_MS);
    return;
  }
  /* And at most as many set-ups at once as calls may start at once (a pool grown by a burst
   * refills a few at a time, not all in one go). */
  uint64_t now = cm_now_ms();
  size_t starting = 0;
  for (size_t i = 0; i < slot->owner->max_held; i++)
    starting += slot->held[i].run && now < slot->held[i].since + PRESTART_STAGGER_MS;
  size_t room = exec_admission_max_starting(x);
  for (size_t i = 0; i < slot->owner->max_held && !slot_given_up(slot); i++) {
    prestart_held_t *h = &slot->held[i];
    if (h->run || slot_ready(slot) >= slot->target) continue;
    /* (Past the budget the shape waits for room: a later call of it looks again.) */
    if (!within_budget(slot)) return;
    if (starting >= room) {
      prestart_schedule(slot, PRESTART_STAGGER_MS);
      return;
    }
    starting++;
    cm_error_t err = CM_ERROR_INIT;
    if (held_start(slot, h, &err) < 0) {
      cm_warn("prestarting a sandbox: %s", cm_error_message(&err));
      cm_error_release(&err);
      h->run = NULL;
      held_drop(h);
      slot_failed(slot);
      prestart_schedule(slot, PRESTART_RETRY_MS);
      return;
    }
  }
}

void exec_prestart_start(srv_server_t *s) {
  exec_state_t *x = srv_server_exec(s);
  const srv_config_t *cfg = srv_server_config(s);
  if (!cfg->prestart || !cfg->prestart_count || x->prestart || x->prestart_stopped) return;
  exec_prestart_t *p = xcalloc(1, sizeof *p);
  p->exec = x;
  p->server = s;
  p->per_shape = (size_t)cfg->prestart_count;
  p->max_held = CM_MAX(p->per_shape, (size_t)cfg->prestart_max);
  /* (The tests' knob: they cannot wait a minute to see a pool shrink.) */
  const char *shrink = getenv("MPS_PRESTART_SHRINK_MS");
  p->shrink_ms = shrink && *shrink ? strtoull(shrink, NULL, 10) : 0;
  if (!p->shrink_ms) p->shrink_ms = PRESTART_SHRINK_MS;
  for (size_t i = 0; i < PRESTART_SLOTS; i++) {
    p->slots[i].owner = p;
    p->slots[i].held = xcalloc(p->max_held, sizeof *p->slots[i].held);
    for (size_t j = 0; j < p->max_held; j++) p->slots[i].held[j].go_fd = -1;
  }
  x->prestart = p;
  /* The commonest shape needs the default interpreter: once discovery is done. */
  p->py_wait = py_registry_when_ready(srv_server_pythons(s), prestart_on_python, p);
}

void exec_prestart_call_done(exec_state_t *x) {
  exec_prestart_t *p = x->prestart;
  for (size_t i = 0; p && i < PRESTART_SLOTS; i++) {
    prestart_slot_t *slot = &p->slots[i];
    if (!slot->timer || !slot->deferred) continue;
    cm_timer_cancel(slot->timer);
    slot->timer = NULL;
    slot->deferred = false;
    prestart_fill_now(slot);
  }
}

void exec_prestart_stop(exec_state_t *x, bool drop) {
  x->prestart_stopped = true;
  exec_prestart_t *p = x->prestart;
  if (!p) return;
  cm_timer_cancel(p->shrink);
  p->shrink = NULL;
  for (size_t i = 0; i < PRESTART_SLOTS; i++) {
    prestart_slot_t *slot = &p->slots[i];
    cm_timer_cancel(slot->timer);
    slot->timer = NULL;
    slot->deferred = false;
    for (size_t j = 0; drop && j < p->max_held; j++) held_drop(&slot->held[j]);
  }
}

void exec_prestart_free(exec_state_t *x) {
  exec_prestart_t *p = x->prestart;
  if (!p) return;
  x->prestart = NULL;
  cm_timer_cancel(p->shrink);
  if (p->py_wait) py_registry_cancel_wait(srv_server_pythons(x->server), p->py_wait);
  for (size_t i = 0; i < PRESTART_SLOTS; i++) {
    slot_clear(&p->slots[i]);
    free(p->slots[i].held);
  }
  free(p);
}

/* Whether principal sees slot: the commonest shape, and its own (NULL: every slot). */
static bool slot_visible(const prestart_slot_t *slot, const char *principal) {
  return !principal || !slot->principal || strcmp(slot->principal, principal) == 0;
}

void exec_prestart_counts(exec_state_t *x, const char *principal, exec_prestart_counts_t *out) {
  exec_prestart_t *p = x->prestart;
  memset(out, 0, sizeof *out);
  if (!p) return;
  out->per_shape = p->per_shape;
  out->max_per_shape = grow_cap(p);
  out->other_shapes_max = PRESTART_PRINCIPALS;
  out->taken = p->taken;
  out->taken_interpreter = p->taken_warm;
  out->failed = p->failed;
  for (size_t i = 0; i < PRESTART_SLOTS; i++) {
    const prestart_slot_t *slot = &p->slots[i];
    if (!slot_visible(slot, principal)) continue;
    for (size_t j = 0; j < p->max_held; j++) {
      if (!slot->held[j].run) continue;
      out->ready++;
      if (slot->held[j].warm) out->ready_interpreters++;
    }
  }
}

void exec_metrics(exec_state_t *x, exec_metrics_t *out) {
  exec_admission_metrics(x, out);
  exec_prestart_counts_t pc;
  exec_prestart_counts(x, NULL, &pc);
  out->prestart_ready = pc.ready;
  out->prestart_ready_interpreters = pc.ready_interpreters;
  out->prestart_taken = pc.taken;
  out->prestart_taken_interpreter = pc.taken_interpreter;
  out->prestart_failed = pc.failed;
}

json_t *exec_prestart_shapes(exec_state_t *x, const char *principal) {
  exec_prestart_t *p = x->prestart;
  json_t *a = json_array();
  for (size_t i = 0; p && i < PRESTART_SLOTS; i++) {
    const prestart_slot_t *slot = &p->slots[i];
    if (!slot->used || !slot_visible(slot, principal)) continue;
    json_array_append_new(
        a, json_pack("{s:s, s:s, s:o, s:b, s:s, s:I, s:I}", "shape",
                     i == 0 ? "commonest" : "last other", "python", slot->py->version,
                     "environment", slot->env ? json_string(slot->env->key) : json_null(),
                     "network", slot->network, "holds",
                     slot_given_up(slot) ? "nothing (given up)"
                     : slot->warm        ? "interpreter"
                                         : "sandbox",
                     "ready", (json_int_t)slot_ready(slot), "target", (json_int_t)slot->target));
  }
  return a;
}

bool exec_prestart_describe(exec_state_t *x, uint64_t *taken) {
  exec_prestart_t *p = x->prestart;
  *taken = p ? p->taken : 0;
  return p && !slot_given_up(&p->slots[0]) && sbx_backend_can_hold(srv_server_backend(x->server));
}

static bool slot_matches(const prestart_slot_t *slot, const exec_job_t *job) {
  return slot->used && slot->py == job->py && slot->network == job->spec.net.on &&
         !slot->env == !job->env && (!job->env || strcmp(slot->env->key, job->env->key) == 0);
}

static bool same_dir(const char *path, dev_t dev, ino_t ino) {
  struct stat st;
  return stat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

/* The slot of principal's last other shape, or NULL. */
static prestart_slot_t *slot_of(exec_prestart_t *p, const char *principal) {
  for (size_t i = 1; i < PRESTART_SLOTS; i++)
    if (p->slots[i].used && strcmp(p->slots[i].principal, principal) == 0) return &p->slots[i];
  return NULL;
}

/* Where principal's new last other shape goes: its own slot, else a free one, else the one
 * used least recently (another principal's shape goes). */
static prestart_slot_t *slot_for(exec_prestart_t *p, const char *principal) {
  prestart_slot_t *own = slot_of(p, principal), *oldest = NULL;
  if (own) return own;
  for (size_t i = 1; i < PRESTART_SLOTS; i++) {
    prestart_slot_t *slot = &p->slots[i];
    if (!slot->used) return slot;
    if (!oldest || slot->last_used < oldest->last_used) oldest = slot;
  }
  return oldest;
}

/* A held sandbox of the job's shape, when there is one (the commonest shape's, or the job's
 * principal's last other one): its run and work directory become the job's
 * (exec-internal.h).  Otherwise the job's shape becomes its principal's last other shape
 * (when it is not the commonest), so that the principal's next such call finds one. */
bool exec_prestart_take(exec_job_t *job) {
  exec_prestart_t *p = job->exec->prestart;
  /* A call with secrets has their placeholders in its environment: a sandbox of its own. */
  if (job->spec.secrets.n) return false;
  if (!p || !p->slots[0].used || !sbx_backend_can_hold(srv_server_backend(job->server)))
    return false;
  const char *principal = job->spec.principal ? job->spec.principal : "";
  prestart_slot_t *candidates[] = {&p->slots[0], slot_of(p, principal)};
  for (size_t i = 0; i < CM_ARRAY_SIZE(candidates); i++) {
    prestart_slot_t *slot = candidates[i];
    if (!slot || !slot_matches(slot, job)) continue;
    slot->last_used = cm_now_ms();
    prestart_held_t *h = NULL;
    for (size_t j = 0; j < p->max_held; j++) {
      prestart_held_t *c = &slot->held[j];
      if (c->run && job->env && !same_dir(job->env->host_dir, c->env_dev, c->env_ino))
        held_drop(c); /* set up with an environment since evicted or rebuilt */
      if (c->run && (!h || c->since < h->since)) h = c;
    }
    if (!h) {
      slot_missed(slot);
      prestart_schedule(slot, 0); /* (already due, or given up on) */
      return false;
    }
    job->run = h->run;
    job->egress = h->egress;
    job->workdir = h->workdir;
    job->workdir_mounted = h->workdir_mounted;
    job->prestarted = h->warm ? EXEC_PRESTARTED_INTERPRETER : EXEC_PRESTARTED_SANDBOX;
    job->go_fd = h->warm ? h->go_fd : -1;
    h->run = NULL;
    h->egress = NULL;
    h->workdir = NULL;
    h->warm = false;
    h->go_fd = -1;
    slot->failures = 0;
    slot->target = CM_MAX(slot->target, p->per_shape);
    p->taken++;
    if (job->prestarted == EXEC_PRESTARTED_INTERPRETER) p->taken_warm++;
    /* The next one: at once when this was the last but one (a burst is on), else once a
     * call was answered, or PRESTART_DEFER_MS from now. */
    bool low = slot_ready(slot) <= 1, had_timer = slot->timer != NULL;
    prestart_schedule(slot, low ? 0 : PRESTART_DEFER_MS);
    /* (Only a timer of this call's: one already due, a failure's retry say, keeps its time.) */
    if (slot->timer && !had_timer && !low) slot->deferred = true;
    return true;
  }
  prestart_slot_t *own = slot_for(p, principal);
  slot_clear(own);
  slot_set_shape(own, principal, job->py, job->env ? env_handle_copy_unlocked(job->env) : NULL,
                 job->spec.net.on);
  prestart_schedule(own, 0);
  return false;
}

int exec_prestart_go(exec_job_t *job, cm_error_t *err) {
  json_t *o = json_pack("{s:s, s:s}", "op", "run", "script", "script.py");
  size_t len;
  cleanup_free char *frame = exec_kframe_encode(o, &len);
  json_decref(o);
  /* A few bytes into an empty FIFO whose other end only ever reads: never blocks, never
   * short. */
  ssize_t n;
  do n = write(job->go_fd, frame, len);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)len)
    return cm_error_set(err, n < 0 ? errno : EIO, CM_ERR_IO,
                        "sending the go to the prestarted interpreter");
  return 0;
}

const char *exec_prestarted_name(int prestarted) {
  return prestarted == EXEC_PRESTARTED_INTERPRETER ? "interpreter"
         : prestarted == EXEC_PRESTARTED_SANDBOX   ? "sandbox"
                                                   : "no";
}
