/* The server instance: a random id and the uid block it holds, so that two servers never
 * share a run's uid or a cgroup, whatever their pids (two servers that are each pid 1 of a
 * pid namespace have the same pid, and with pid_max > 32768 pids agree modulo any block
 * count).
 *
 * In the state directory, instances/ holds for each live instance:
 *   <id>           its record ("instance ID\nboot BOOT-ID\nuid_block N\npid PID\n": the pid
 *                  is informative only, as seen in the server's pid namespace), flocked by
 *                  the instance for as long as it lives;
 *   uid-block-<N>  the claim on uid block N (flocked by its holder for as long as it lives).
 * A lock is taken on a file created under another name and renamed into place, or checked
 * after locking to still be the file at the path (a file unlinked by its last holder between
 * another's open and lock is not a claim), so two instances never hold one name.
 *
 * An instance is provably gone when its record exists and either names another boot or can
 * be locked: only then are the cgroup directories named after it swept.  The cgroup tree is
 * the machine's, shared by instances of every state directory, so each instance also holds a
 * lock on /run/mcp-python-exec-sandbox/instances/<id> (a tmpfs, emptied at boot; for a
 * server that is not root, $XDG_RUNTIME_DIR/mcp-python-exec-sandbox/instances): an instance
 * of another state directory that died (SIGKILL, a crash) is provably gone when that file
 * can be locked, and its frozen or running leftovers are swept by the next start anywhere.
 * What has neither (a directory of an older version, "mps-<pid>", or of an instance whose
 * /run is not ours, in a container) is left alone. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sandbox/sandbox-internal.h"

#define SBX_UID_BLOCKS (1u << 15)
#define INSTANCE_RECORD_MAX 512

static struct {
  char id[SBX_INSTANCE_ID_LEN + 1];
  char boot[64];
  char *dir;      /* state/instances, or NULL (no records: unit tests, no state directory) */
  int record_fd;  /* our record, locked */
  int block_fd;   /* our uid block's claim, locked */
  char *machine;  /* the machine-wide directory of live instances' locks, or NULL */
  int machine_fd; /* ours there, locked */
  int64_t block;  /* -1: not chosen yet */
  bool keep;      /* keep the record at close: something named after us is left behind */
} inst = {.record_fd = -1, .block_fd = -1, .machine_fd = -1, .block = -1};

static void random_bytes(void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = getrandom((char *)buf + got, len - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      /* No getrandom (a very old kernel or seccomp): uniqueness, not secrecy, is needed. */
      uint64_t x = cm_now_ms() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)buf;
      for (; got < len; got++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ((unsigned char *)buf)[got] = (unsigned char)(x >> 56);
      }
      return;
    }
    got += (size_t)n;
  }
}

static void ensure_id(void) {
  if (inst.id[0]) return;
  unsigned char raw[SBX_INSTANCE_ID_LEN / 2];
  random_bytes(raw, sizeof raw);
  for (size_t i = 0; i < sizeof raw; i++) snprintf(inst.id + 2 * i, 3, "%02x", raw[i]);
  cleanup_free char *boot = NULL;
  size_t len = 0;
  if (cm_read_file("/proc/sys/kernel/random/boot_id", 128, &boot, &len, NULL) == 0) {
    while (len && (boot[len - 1] == '\n' || boot[len - 1] == ' ')) len--;
    if (len < sizeof inst.boot) memcpy(inst.boot, boot, len);
  }
}

const char *sbx_instance_id(void) {
  ensure_id();
  return inst.id;
}

bool sbx_instance_id_valid(const char *s) {
  size_t n = 0;
  for (; s[n]; n++) {
    if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return false;
  }
  return n == SBX_INSTANCE_ID_LEN;
}

/* Opens and locks dir/name (made if missing), or -1 when another holds it.  The file must
 * still be the one at the path once locked: a holder that unlinked it after our open left
 * us an orphan. */
static int lock_existing(const char *dir, const char *name, bool create) {
  cleanup_free char *path = xasprintf("%s/%s", dir, name);
  for (int tries = 0; tries < 4; tries++) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
      close(fd);
      return -1;
    }
    struct stat held, now;
    if (fstat(fd, &held) == 0 && stat(path, &now) == 0 && held.st_dev == now.st_dev &&
        held.st_ino == now.st_ino)
      return fd;
    close(fd);
  }
  return -1;
}

static void write_all_at0(int fd, const char *text) {
  if (ftruncate(fd, 0) < 0) return;
  size_t len = strlen(text), off = 0;
  while (off < len) {
    ssize_t n = pwrite(fd, text + off, len - off, (off_t)off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += (size_t)n;
  }
}

/* A uid block nobody else holds, claimed by a lock on instances/uid-block-N. */
static void claim_block(void) {
  uint32_t r;
  for (int tries = 0; inst.dir && tries < 256; tries++) {
    random_bytes(&r, sizeof r);
    uint32_t block = r & (SBX_UID_BLOCKS - 1);
    char name[32];
    snprintf(name, sizeof name, "uid-block-%u", block);
    int fd = lock_existing(inst.dir, name, true);
    if (fd < 0) continue;
    cleanup_free char *text = xasprintf("instance %s\n", inst.id);
    write_all_at0(fd, text);
    inst.block_fd = fd;
    inst.block = block;
    return;
  }
  if (inst.dir) cm_warn("no free uid block claimed in %s; taking a random one", inst.dir);
  random_bytes(&r, sizeof r);
  inst.block = r & (SBX_UID_BLOCKS - 1);
}

unsigned sbx_instance_uid_block(void) {
  ensure_id();
  if (inst.block < 0) claim_block();
  return (unsigned)inst.block;
}

/* The value of "key " on a line of text, copied to out. */
static bool record_field(const char *text, const char *key, char *out, size_t out_len) {
  size_t kl = strlen(key);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
    if (strncmp(p, key, kl) != 0 || p[kl] != ' ') continue;
    const char *v = p + kl + 1;
    size_t n = strcspn(v, "\n");
    if (n >= out_len) return false;
    memcpy(out, v, n);
    out[n] = '\0';
    return true;
  }
  return false;
}

/* Removes the records of instances that are gone and named another boot: nothing of theirs
 * (cgroups, processes) can exist any more; and half-written records nobody holds.  Records of this
 * boot stay for the sweeps that need them as proof. */
static void forget_other_boots(void) {
  DIR *d = opendir(inst.dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".new-", 5) == 0) {
      /* A record an instance died writing: nobody holds it, and it is older than the moment
       * between a live instance's creating and locking it. */
      int fd = lock_existing(inst.dir, e->d_name, false);
      struct stat st;
      if (fd >= 0 && fstat(fd, &st) == 0 && time(NULL) - st.st_mtime > 60)
        unlinkat(dirfd(d), e->d_name, 0);
      if (fd >= 0) close(fd);
      continue;
    }
    if (!sbx_instance_id_valid(e->d_name) || strcmp(e->d_name, inst.id) == 0) continue;
    cleanup_free char *path = xasprintf("%s/%s", inst.dir, e->d_name), *text = NULL;
    char boot[64];
    if (cm_read_file(path, INSTANCE_RECORD_MAX, &text, NULL, NULL) < 0 ||
        !record_field(text, "boot", boot, sizeof boot) || !inst.boot[0] ||
        strcmp(boot, inst.boot) == 0)
      continue;
    sbx_instance_forget(e->d_name);
  }
  closedir(d);
}

/* dir made (0700, ours) with its parents as needed; false if it is not a directory of ours. */
static bool own_dir(const char *dir) {
  cleanup_free char *copy = xstrdup(dir);
  for (char *p = copy + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    (void)mkdir(copy, 0755);
    *p = '/';
  }
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) return false;
  struct stat st;
  return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid();
}

/* Our lock in the machine-wide directory (best effort: without it, a leftover of ours is
 * swept only by an instance of our state directory). */
static void open_machine_lock(void) {
  const char *runtime = getenv("XDG_RUNTIME_DIR");
  free(inst.machine);
  inst.machine = geteuid() == 0 ? xstrdup("/run/mcp-python-exec-sandbox/instances")
                 : runtime && runtime[0] == '/'
                     ? xasprintf("%s/mcp-python-exec-sandbox/instances", runtime)
                     : NULL;
  if (!inst.machine) return;
  if (!own_dir(inst.machine)) {
    cm_debug("instances: %s is not a directory of ours; no machine-wide record", inst.machine);
    free(inst.machine);
    inst.machine = NULL;
    return;
  }
  cleanup_free char *tmp = xasprintf("%s/.new-%s", inst.machine, inst.id);
  cleanup_free char *path = xasprintf("%s/%s", inst.machine, inst.id);
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  if (flock(fd, LOCK_EX | LOCK_NB) < 0 ||
      renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) < 0) {
    close(fd);
    unlink(tmp);
    return;
  }
  inst.machine_fd = fd;
}

int sbx_instance_open(const char *state_dir, cm_error_t *err) {
  ensure_id();
  if (inst.record_fd >= 0) return 0;
  free(inst.dir);
  inst.dir = xasprintf("%s/instances", state_dir);
  if (mkdir(inst.dir, 0700) < 0 && errno != EEXIST)
    return cm_error_set(err, errno, CM_ERR_IO, "creating %s", inst.dir);
  struct stat st;
  if (lstat(inst.dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
    return cm_error_set(err, 0, CM_ERR_UNAVAILABLE, "%s must be a directory of ours", inst.dir);
  forget_other_boots();
  if (inst.block < 0) claim_block();
  /* Written and locked under another name, then renamed: a sweep never sees it unlocked. */
  cleanup_free char *tmp = xasprintf("%s/.new-%s", inst.dir, inst.id);
  cleanup_free char *path = xasprintf("%s/%s", inst.dir, inst.id);
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return cm_error_set(err, errno, CM_ERR_IO, "creating %s", tmp);
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int saved = errno;
    close(fd);
    unlink(tmp);
    return cm_error_set(err, saved, CM_ERR_IO, "locking %s", tmp);
  }
  cleanup_free char *text =
      xasprintf("instance %s\nboot %s\nuid_block %lld\npid %ld\n", inst.id,
                inst.boot[0] ? inst.boot : "unknown", (long long)inst.block, (long)getpid());
  write_all_at0(fd, text);
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) < 0) {
    int saved = errno;
    close(fd);
    unlink(tmp);
    return cm_error_set(err, saved, CM_ERR_IO, "creating %s", path);
  }
  inst.record_fd = fd;
  open_machine_lock();
  return 0;
}

/* An instance of another state directory: gone when its machine-wide lock can be taken. */
static bool machine_gone(const char *id) {
  if (!inst.machine) return false;
  int fd = lock_existing(inst.machine, id, false);
  if (fd < 0) return false;
  close(fd);
  return true;
}

bool sbx_instance_gone(const char *id) {
  if (!inst.dir || !sbx_instance_id_valid(id) || strcmp(id, sbx_instance_id()) == 0) return false;
  cleanup_free char *path = xasprintf("%s/%s", inst.dir, id), *text = NULL;
  if (cm_read_file(path, INSTANCE_RECORD_MAX, &text, NULL, NULL) < 0) return machine_gone(id);
  char boot[64];
  if (inst.boot[0] && record_field(text, "boot", boot, sizeof boot) && strcmp(boot, inst.boot))
    return true;
  int fd = lock_existing(inst.dir, id, false);
  if (fd < 0) return false;
  close(fd); /* ids are never reused: a gone instance stays gone */
  return true;
}

void sbx_instance_forget(const char *id) {
  if (!inst.dir || !sbx_instance_id_valid(id) || strcmp(id, sbx_instance_id()) == 0) return;
  if (inst.machine) {
    int mfd = lock_existing(inst.machine, id, false);
    if (mfd >= 0) {
      cleanup_free char *mpath = xasprintf("%s/%s", inst.machine, id);
      unlink(mpath);
      close(mfd);
    }
  }
  int fd = lock_existing(inst.dir, id, false);
  if (fd < 0) return;
  cleanup_free char *path = xasprintf("%s/%s", inst.dir, id), *text = NULL;
  char block[16];
  if (cm_read_file(path, INSTANCE_RECORD_MAX, &text, NULL, NULL) == 0 &&
      record_field(text, "uid_block", block, sizeof block)) {
    /* Its block's claim, if nobody took the block since: unlinked under our lock. */
    cleanup_free char *name = xasprintf("uid-block-%s", block);
    cleanup_free char *claim_path = xasprintf("%s/%s", inst.dir, name), *claim = NULL;
    int bfd =
        strspn(block, "0123456789") == strlen(block) ? lock_existing(inst.dir, name, false) : -1;
    char owner[SBX_INSTANCE_ID_LEN + 1];
    if (bfd >= 0 && cm_read_file(claim_path, INSTANCE_RECORD_MAX, &claim, NULL, NULL) == 0 &&
        record_field(claim, "instance", owner, sizeof owner) && strcmp(owner, id) == 0)
      unlink(claim_path);
    if (bfd >= 0) close(bfd);
  }
  unlink(path);
  close(fd);
}

void sbx_instance_keep_record(void) {
  inst.keep = true;
}

void sbx_instance_close(void) {
  if (inst.dir && inst.block_fd >= 0) {
    cleanup_free char *claim = xasprintf("%s/uid-block-%lld", inst.dir, (long long)inst.block);
    if (!inst.keep) unlink(claim);
  }
  if (inst.dir && inst.record_fd >= 0 && !inst.keep) {
    cleanup_free char *path = xasprintf("%s/%s", inst.dir, inst.id);
    unlink(path);
  }
  if (inst.machine && inst.machine_fd >= 0 && !inst.keep) {
    cleanup_free char *path = xasprintf("%s/%s", inst.machine, inst.id);
    unlink(path);
  }
  if (inst.machine_fd >= 0) close(inst.machine_fd);
  free(inst.machine);
  inst.machine = NULL;
  if (inst.block_fd >= 0) close(inst.block_fd);
  if (inst.record_fd >= 0) close(inst.record_fd);
  inst.block_fd = inst.record_fd = inst.machine_fd = -1;
  free(inst.dir);
  inst.dir = NULL;
}
