/* Replays fuzz inputs (files, or every regular file of the directories given) through
 * LLVMFuzzerTestOneInput, so corpora and crash regressions run on every test run
 * without libFuzzer.  A missing directory is fine (nothing to replay). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (n < 0) n = 0;
  /* An exact-size heap copy, so ASan sees any read past the end. */
  uint8_t *buf = malloc(n ? (size_t)n : 1);
  size_t got = fread(buf, 1, (size_t)n, f);
  fclose(f);
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 1;
}

int main(int argc, char **argv) {
  int count = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) continue;
    if (S_ISREG(st.st_mode)) {
      count += replay_file(argv[i]);
      continue;
    }
    DIR *d = opendir(argv[i]);
    if (!d) continue;
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
      if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) count += replay_file(path);
    }
    closedir(d);
  }
  /* Always exercise the empty input too. */
  LLVMFuzzerTestOneInput((const uint8_t *)"", 0);
  printf("replayed %d inputs\n", count + 1);
  return 0;
}
