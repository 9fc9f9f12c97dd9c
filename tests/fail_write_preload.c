/* A fault for tests, loaded with LD_PRELOAD: makes the writing of one file fail, as a full or
 * broken disk would, without touching the program. The file is picked by a substring of its path:
 *
 *   DOS_TEST_FAIL_PATH=rank-00001-of-00002   the path (for mkstemp: the template) contains this
 *   DOS_TEST_FAIL_MODE=open                  creating the file fails with EIO (the default)
 *   DOS_TEST_FAIL_MODE=write                 the file is created, and its writes fail with ENOSPC
 *                                            once DOS_TEST_FAIL_AFTER bytes are in it (the write
 *                                            that crosses the limit is cut short first, as on a
 *                                            disk that fills mid-write)
 *   DOS_TEST_FAIL_AFTER=N                    for the write mode (default 4096)
 *
 * dos-train writes its files through runtime/io/atomic_file.cpp: mkstemp (mkstemp64 where off_t is
 * 64-bit) next to the final path, write, fsync, rename. Those are intercepted, and open, openat
 * and fopen opened for writing too, so a change of the write path does not quietly dodge the
 * fault. Opens for reading are left alone (a resumed job reads files of the same name). Each
 * injected fault is announced on stderr ("fail_write_preload: ..."), so a test can tell that it fired.
 * Without DOS_TEST_FAIL_PATH everything passes straight through. */
/* the plain and the 64-bit names are both defined here: no renaming of one to the other (meson
 * builds with -D_FILE_OFFSET_BITS=64) */
#undef _FILE_OFFSET_BITS
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FDS 4096

static const char* fail_path;
static int fail_write_mode;
static long long fail_after = 4096;
/* the descriptors whose writes are watched, and the bytes written to each so far */
static char tracked[MAX_FDS];
static long long written[MAX_FDS];

static int (*real_mkstemp)(char*);
static int (*real_mkstemp64)(char*);
static int (*real_mkostemp)(char*, int);
static int (*real_mkostemp64)(char*, int);
static int (*real_open)(const char*, int, ...);
static int (*real_open64)(const char*, int, ...);
static int (*real_openat)(int, const char*, int, ...);
static int (*real_openat64)(int, const char*, int, ...);
static FILE* (*real_fopen)(const char*, const char*);
static FILE* (*real_fopen64)(const char*, const char*);
static ssize_t (*real_write)(int, const void*, size_t);
static int (*real_close)(int);

static void say(const char* what, const char* path) {
  /* stderr through write(2) directly: no stdio locks, nothing allocated */
  char line[1024];
  int n = snprintf(line, sizeof line, "fail_write_preload[pid %d]: %s %s\n", (int)getpid(), what, path);
  if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
  if (n > 0 && real_write) (void)real_write(2, line, (size_t)n);
}

__attribute__((constructor)) static void init(void) {
  real_mkstemp = (int (*)(char*))dlsym(RTLD_NEXT, "mkstemp");
  real_mkstemp64 = (int (*)(char*))dlsym(RTLD_NEXT, "mkstemp64");
  real_mkostemp = (int (*)(char*, int))dlsym(RTLD_NEXT, "mkostemp");
  real_mkostemp64 = (int (*)(char*, int))dlsym(RTLD_NEXT, "mkostemp64");
  real_open = (int (*)(const char*, int, ...))dlsym(RTLD_NEXT, "open");
  real_open64 = (int (*)(const char*, int, ...))dlsym(RTLD_NEXT, "open64");
  real_openat = (int (*)(int, const char*, int, ...))dlsym(RTLD_NEXT, "openat");
  real_openat64 = (int (*)(int, const char*, int, ...))dlsym(RTLD_NEXT, "openat64");
  real_fopen = (FILE * (*)(const char*, const char*)) dlsym(RTLD_NEXT, "fopen");
  real_fopen64 = (FILE * (*)(const char*, const char*)) dlsym(RTLD_NEXT, "fopen64");
  real_write = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
  const char* p = getenv("DOS_TEST_FAIL_PATH");
  fail_path = p && *p ? p : NULL;
  const char* m = getenv("DOS_TEST_FAIL_MODE");
  fail_write_mode = m && strcmp(m, "write") == 0;
  const char* a = getenv("DOS_TEST_FAIL_AFTER");
  if (a && *a) fail_after = atoll(a);
}

static int matches(const char* path) { return fail_path && path && strstr(path, fail_path) != NULL; }

/* Before the file is created: nonzero when its creation is to fail (errno set). */
static int fail_create(const char* path, const char* how) {
  if (!matches(path) || fail_write_mode) return 0;
  char what[64];
  snprintf(what, sizeof what, "%s fails with EIO:", how);
  say(what, path);
  errno = EIO;
  return 1;
}

/* After it is created: the write mode watches what goes into it. */
static int track(int fd, const char* path) {
  if (fd >= 0 && fd < MAX_FDS && fail_write_mode && matches(path)) {
    written[fd] = 0;
    tracked[fd] = 1;
    say("watching the writes to", path);
  }
  return fd;
}

static int writes_for_open(int flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)) != 0; }

static int mk(int (*real)(char*, int), int (*real_noflags)(char*), char* tmpl, int flags, const char* how) {
  char before[4096];
  snprintf(before, sizeof before, "%s", tmpl ? tmpl : "");
  if (fail_create(before, how)) return -1;
  if (!real && !real_noflags) {
    errno = ENOSYS;
    return -1;
  }
  const int fd = real ? real(tmpl, flags) : real_noflags(tmpl);
  return track(fd, before);
}

int mkstemp(char* tmpl) { return mk(NULL, real_mkstemp, tmpl, 0, "mkstemp"); }
int mkstemp64(char* tmpl) { return mk(NULL, real_mkstemp64 ? real_mkstemp64 : real_mkstemp, tmpl, 0, "mkstemp64"); }
int mkostemp(char* tmpl, int flags) { return mk(real_mkostemp, NULL, tmpl, flags, "mkostemp"); }
int mkostemp64(char* tmpl, int flags) {
  return mk(real_mkostemp64 ? real_mkostemp64 : real_mkostemp, NULL, tmpl, flags, "mkostemp64");
}

#define OPEN_BODY(real, how, ...)                                  \
  mode_t mode = 0;                                                 \
  if (flags & (O_CREAT | O_TMPFILE)) {                             \
    va_list ap;                                                    \
    va_start(ap, flags);                                           \
    mode = (mode_t)va_arg(ap, int);                                \
    va_end(ap);                                                    \
  }                                                                \
  const int w = writes_for_open(flags);                            \
  if (w && fail_create(path, how)) return -1;                      \
  if (!(real)) {                                                   \
    errno = ENOSYS;                                                \
    return -1;                                                     \
  }                                                                \
  const int fd = (real)(__VA_ARGS__, flags, mode);                 \
  return w ? track(fd, path) : fd;

int open(const char* path, int flags, ...) { OPEN_BODY(real_open, "open", path) }
int open64(const char* path, int flags, ...) { OPEN_BODY(real_open64 ? real_open64 : real_open, "open64", path) }
int openat(int dirfd, const char* path, int flags, ...) { OPEN_BODY(real_openat, "openat", dirfd, path) }
int openat64(int dirfd, const char* path, int flags, ...) {
  OPEN_BODY(real_openat64 ? real_openat64 : real_openat, "openat64", dirfd, path)
}

static FILE* fo(FILE* (*real)(const char*, const char*), const char* path, const char* mode, const char* how) {
  /* stdio's own writes do not come through write() here: the write mode fails the opening too */
  if (mode && strpbrk(mode, "wa+") && matches(path)) {
    char what[64];
    snprintf(what, sizeof what, "%s fails with %s:", how, fail_write_mode ? "ENOSPC" : "EIO");
    say(what, path);
    errno = fail_write_mode ? ENOSPC : EIO;
    return NULL;
  }
  if (!real) {
    errno = ENOSYS;
    return NULL;
  }
  return real(path, mode);
}

FILE* fopen(const char* path, const char* mode) { return fo(real_fopen, path, mode, "fopen"); }
FILE* fopen64(const char* path, const char* mode) {
  return fo(real_fopen64 ? real_fopen64 : real_fopen, path, mode, "fopen64");
}

ssize_t write(int fd, const void* buf, size_t n) {
  if (!real_write) real_write = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  if (fd < 0 || fd >= MAX_FDS || !tracked[fd]) return real_write(fd, buf, n);
  const long long room = fail_after - written[fd];
  if (room <= 0) {
    char what[96];
    snprintf(what, sizeof what, "write fails with ENOSPC after %lld bytes, fd", written[fd]);
    char fdname[16];
    snprintf(fdname, sizeof fdname, "%d", fd);
    say(what, fdname);
    errno = ENOSPC;
    return -1;
  }
  if ((long long)n > room) n = (size_t)room; /* the disk fills during this write: a short one */
  const ssize_t w = real_write(fd, buf, n);
  if (w > 0) written[fd] += w;
  return w;
}

int close(int fd) {
  if (!real_close) real_close = (int (*)(int))dlsym(RTLD_NEXT, "close");
  if (fd >= 0 && fd < MAX_FDS) tracked[fd] = 0;
  return real_close(fd);
}
