/* The per-run uids of the backends that run scripts as real, unprivileged host uids when the
 * server is root: bubblewrap (the drop helper switches to it) and docker and podman (the
 * container's --user; rootful engines map no uids).
 *
 * Per-run uid: SBX_UID_BASE + block * 2^12 + slot, where block (0..2^15-1) is the instance's
 * own (chosen at random and claimed under the state directory: sbx_instance_open, never the
 * pid, which two servers in their own pid namespaces share) and a slot (0..4095) is
 * reserved from a run's build until the run must be over (timeout + grace + a margin).  A
 * fresh uid per run means RLIMIT_NPROC (counted per uid by the kernel) bounds this run alone,
 * not this run plus concurrent runs plus real users, and runs never share an identity for
 * files, signals or the kernel's per-uid state (the user keyring, inotify's per-user limits).
 * The block keeps several server instances apart.  Environment builds take their uid from
 * the same pool (sbx_identity_new: one slot for all steps of a build, reserved until the build
 * ends and the margin after it), so no two builds and no build and run share a uid, an
 * RLIMIT_NPROC budget or files.  The range 2,000,000,000-2,134,217,727 is far above the ids
 * distributions, systemd (DynamicUser stops at 65519) and container subuid ranges (allocated
 * in 65536-blocks from 100000 up) hand out, and stays below 2^31 for tools that treat uids as
 * signed.
 *
 * One pool per process: uids are the host's, whichever backend takes them. */
#include <dirent.h>
#include <sys/stat.h>

#include "sandbox/sandbox-internal.h"

#define SBX_UID_BASE 2000000000u
#define SBX_UID_RUN_BITS 12
#define SBX_UID_RUNS (1u << SBX_UID_RUN_BITS)
#define SBX_UID_REUSE_MARGIN_MS 60000

typedef struct uid_pool {
  uint32_t next_slot;
  uint64_t *busy_until; /* SBX_UID_RUNS entries: cm_now_ms() until which a uid is taken */
} uid_pool_t;

static uid_pool_t pool;

static bool uid_in_use(uid_t uid) {
  DIR *d = opendir("/proc");
  if (!d) return false;
  bool used = false;
  struct dirent *e;
  while (!used && (e = readdir(d))) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, 0) == 0 && st.st_uid == uid) used = true;
  }
  closedir(d);
  return used;
}

uid_t sbx_uid_block(unsigned *count) {
  *count = SBX_UID_RUNS;
  return SBX_UID_BASE + (sbx_instance_uid_block() << SBX_UID_RUN_BITS);
}

/* No /proc scan on the normal path (it costs ~3 us per host process); only if every slot is
 * reserved (SBX_UID_RUNS runs without a timeout, or that many at once) does a scan pick a
 * slot nobody uses. */
uid_t sbx_uid_take(const sbx_limits_t *l, int64_t *slot_out) {
  if (!pool.busy_until) pool.busy_until = xcalloc(SBX_UID_RUNS, sizeof(uint64_t));
  unsigned n;
  uid_t first = sbx_uid_block(&n);
  uint64_t now = cm_now_ms();
  uint64_t until =
      l->timeout_ms ? now + l->timeout_ms + l->grace_ms + SBX_UID_REUSE_MARGIN_MS : UINT64_MAX;
  *slot_out = -1;
  for (uint32_t i = 0; i < SBX_UID_RUNS; i++) {
    uint32_t slot = pool.next_slot++ & (SBX_UID_RUNS - 1);
    if (pool.busy_until[slot] > now) continue;
    pool.busy_until[slot] = until;
    *slot_out = slot;
    return first + slot;
  }
  for (uint32_t i = 0; i < SBX_UID_RUNS; i++) {
    uint32_t slot = pool.next_slot++ & (SBX_UID_RUNS - 1);
    uid_t uid = first + slot;
    if (!uid_in_use(uid)) return uid;
  }
  cm_warn("every sandbox uid slot is in use; sharing one");
  return first + (pool.next_slot++ & (SBX_UID_RUNS - 1));
}

void sbx_uid_reserve(int64_t slot, uint64_t until_ms) {
  if (slot < 0 || !pool.busy_until) return;
  pool.busy_until[slot & (SBX_UID_RUNS - 1)] =
      until_ms == UINT64_MAX ? UINT64_MAX : until_ms + SBX_UID_REUSE_MARGIN_MS;
}

void sbx_uid_identity_new(sbx_identity_t *id) {
  sbx_limits_t forever = {0}; /* reserved until released */
  id->uid = sbx_uid_take(&forever, &id->slot);
  id->has_uid = true;
}

void sbx_uid_identity_release(sbx_identity_t *id) {
  sbx_uid_reserve(id->slot, cm_now_ms());
}
