// Host memory available under cgroup limits (runtime/host_memory.h: cgroup_memory_limit,
// host_memory_available; dos.h: check_host_memory). On fake cgroup trees in a temporary folder: a v1
// memory hierarchy and a v2 one, a limit set on an ancestor (as Slurm sets the job's --mem above
// its steps) and a tighter one below, inactive file cache counted as reclaimable, "max" and v1's
// "no limit" value, a mount that shows only part of the hierarchy (containers), an escaped mount
// point, and trees without any limit. Then live, where this process may make a child of its own v1
// memory cgroup (root on the CI machine; skipped elsewhere): the process moved into a child with a
// 3 GB limit sees at most 3 GB, and check_host_memory refuses 4 GB with a message naming the
// cgroup, then the process moves back and the child is removed.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "cmocka_cpp.h"
#include "dos.h"
#include "host_memory.h"

namespace {

std::string g_tmp;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) fail_msg("cannot write %s", path.c_str());
}

void make_dirs(const std::string& path) {
  std::string cur;
  for (std::size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') {
      cur = path.substr(0, i);
      ::mkdir(cur.c_str(), 0755);
    }
}

/// A v1 memory cgroup folder with its limit ("" for none: the kernel's near-2^63 value), usage,
/// file cache (inactive and active) and shmem, bytes (shmem is not reclaimable: counted as used).
void v1_group(const std::string& dir, const std::string& limit, std::size_t usage, std::size_t inactive_file,
              std::size_t active_file = 0, std::size_t shmem = 0) {
  make_dirs(dir);
  write_file(dir + "/memory.limit_in_bytes", (limit.empty() ? "9223372036854771712" : limit) + "\n");
  write_file(dir + "/memory.usage_in_bytes", std::to_string(usage) + "\n");
  write_file(dir + "/memory.stat", "cache 1\nrss 2\nactive_file 11\ntotal_cache 5\ntotal_shmem " + std::to_string(shmem) +
                                       "\ntotal_inactive_file " + std::to_string(inactive_file) +
                                       "\ntotal_active_file " + std::to_string(active_file) + "\n");
}

/// A v2 cgroup folder: memory.max ("max" for none), memory.current, memory.stat's file cache
/// (inactive, active), reclaimable slab and shmem.
void v2_group(const std::string& dir, const std::string& max, std::size_t current, std::size_t inactive_file,
              std::size_t active_file = 0, std::size_t slab_reclaimable = 0, std::size_t shmem = 0) {
  make_dirs(dir);
  write_file(dir + "/memory.max", max + "\n");
  write_file(dir + "/memory.current", std::to_string(current) + "\n");
  write_file(dir + "/memory.stat", "anon 3\nfile 9\nshmem " + std::to_string(shmem) + "\nactive_file " +
                                       std::to_string(active_file) + "\ninactive_file " + std::to_string(inactive_file) +
                                       "\nslab_reclaimable " + std::to_string(slab_reclaimable) + "\n");
}

const std::size_t GB = 1000000000;

void test_v1_nested_limits(void**) {
  const std::string root = g_tmp + "/v1", mount = root + "/sys/fs/cgroup/memory";
  // the job's limit 100 GB with 30 GB used, of which 10 GB inactive file cache: 80 GB left;
  // the step below it: 90 GB limit, 5 GB used: 85 GB left, so the job's level binds
  v1_group(mount, "", 50 * GB, 0);
  v1_group(mount + "/slurm/uid_0/job_7", std::to_string(100 * GB), 30 * GB, 10 * GB);
  v1_group(mount + "/slurm/uid_0/job_7/step_0", std::to_string(90 * GB), 5 * GB, 0);
  write_file(root + "/mountinfo",
             "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
             "32 31 0:29 / " + root + "/sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
             "35 31 0:32 / " + mount + " rw,relatime - cgroup cgroup rw,memory\n");
  write_file(root + "/cgroup", "4:cpu:/other\n3:memory:/slurm/uid_0/job_7/step_0\n0::/\n");
  dos::detail::CgroupLimit c = dos::detail::cgroup_memory_limit(root + "/mountinfo", root + "/cgroup");
  assert_true(c.limit == 100 * GB);
  assert_true(c.available == 80 * GB);
  assert_string_equal(c.dir.c_str(), (mount + "/slurm/uid_0/job_7").c_str());
  // a tighter step: 20 GB limit, 16 GB used: 4 GB left binds
  v1_group(mount + "/slurm/uid_0/job_7/step_0", std::to_string(20 * GB), 16 * GB, 0);
  c = dos::detail::cgroup_memory_limit(root + "/mountinfo", root + "/cgroup");
  assert_true(c.limit == 20 * GB && c.available == 4 * GB);
  // active file cache is reclaimed too, shmem is not: 20 - (19 - 2 - 3) = 6 GB left
  v1_group(mount + "/slurm/uid_0/job_7/step_0", std::to_string(20 * GB), 19 * GB, 2 * GB, 3 * GB, 5 * GB);
  c = dos::detail::cgroup_memory_limit(root + "/mountinfo", root + "/cgroup");
  assert_true(c.limit == 20 * GB && c.available == 6 * GB);
  // usage above the limit (the cache not yet reclaimed counted out): 0 left, not a wrapped value
  v1_group(mount + "/slurm/uid_0/job_7/step_0", std::to_string(20 * GB), 25 * GB, 1 * GB);
  c = dos::detail::cgroup_memory_limit(root + "/mountinfo", root + "/cgroup");
  assert_true(c.limit == 20 * GB && c.available == 0);
  // no limit anywhere: limit 0
  v1_group(mount + "/slurm/uid_0/job_7", "", 30 * GB, 0);
  v1_group(mount + "/slurm/uid_0/job_7/step_0", "", 5 * GB, 0);
  c = dos::detail::cgroup_memory_limit(root + "/mountinfo", root + "/cgroup");
  assert_true(c.limit == 0);
  // the memory controller not mounted: nothing found
  write_file(root + "/mountinfo2", "32 31 0:29 / " + root + "/sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n");
  c = dos::detail::cgroup_memory_limit(root + "/mountinfo2", root + "/cgroup");
  assert_true(c.limit == 0);
  // the controller co-mounted with cpu, a named hierarchy "name=memory" that is not it, a line
  // without super options: the memory one found, the others ignored
  v1_group(mount + "/slurm/uid_0/job_7", std::to_string(100 * GB), 30 * GB, 10 * GB);
  write_file(root + "/mountinfo3", "33 31 0:30 / " + root + "/named rw - cgroup cgroup rw,name=memory\n"
                                   "34 31 0:31 / " + root + "/bare rw - cgroup cgroup\n"
                                   "35 31 0:32 / " + mount + " rw,relatime - cgroup cgroup rw,cpu,memory\n");
  write_file(root + "/cgroup3", "5:name=memory:/x\n3:cpu,memory:/slurm/uid_0/job_7/step_0\n");
  c = dos::detail::cgroup_memory_limit(root + "/mountinfo3", root + "/cgroup3");
  assert_true(c.limit == 100 * GB && c.available == 80 * GB);
  // a cgroup namespace over the host's mount (root "/../.."), a path outside the mount's part, a
  // folder not there: nothing can be placed, nothing found (no other group's limit read)
  write_file(root + "/mountinfo4", "35 31 0:32 /../.. " + mount + " rw - cgroup cgroup rw,memory\n");
  write_file(root + "/cgroup4", "3:memory:/\n");
  assert_true(dos::detail::cgroup_memory_limit(root + "/mountinfo4", root + "/cgroup4").limit == 0);
  write_file(root + "/mountinfo5", "35 31 0:32 /slurm/uid_0/job_7 " + mount + "/slurm/uid_0/job_7 rw - cgroup cgroup rw,memory\n");
  write_file(root + "/cgroup5", "3:memory:/slurm/uid_0/job_70/step_0\n");
  assert_true(dos::detail::cgroup_memory_limit(root + "/mountinfo5", root + "/cgroup5").limit == 0);
  write_file(root + "/cgroup6", "3:memory:/slurm/uid_0/job_7/step_9\n");
  assert_true(dos::detail::cgroup_memory_limit(root + "/mountinfo", root + "/cgroup6").limit == 0);
}

void test_v2_and_partial_mount(void**) {
  const std::string root = g_tmp + "/v2", mount = root + "/cg 2";
  // a container's mount shows the hierarchy from /kubepods/pod1 on, at a mount point with a space
  // (escaped \040 in mountinfo); the process's path is the hierarchy's whole path
  v2_group(mount, "max", 10 * GB, 0);                      // the container's own folder: no limit
  v2_group(mount + "/app", "8000000000", 9 * GB, 3 * GB, 1 * GB, 2 * GB, 4 * GB);  // 8 - (9 - 3 - 1 - 2) = 5 GB left
  write_file(root + "/mountinfo", "41 31 0:38 /kubepods/pod1 " + root + "/cg\\0402 rw,relatime - cgroup2 cgroup2 rw\n");
  write_file(root + "/cgroup", "0::/kubepods/pod1/app\n");
  dos::detail::CgroupLimit c = dos::detail::cgroup_memory_limit(root + "/mountinfo", root + "/cgroup");
  assert_true(c.limit == 8 * GB);
  assert_true(c.available == 5 * GB);
  assert_string_equal(c.dir.c_str(), (mount + "/app").c_str());
  // "max" everywhere: no limit
  v2_group(mount + "/app", "max", 6 * GB, 0);
  c = dos::detail::cgroup_memory_limit(root + "/mountinfo", root + "/cgroup");
  assert_true(c.limit == 0);
  // damaged files (text, empty) count as no limit rather than as 0 bytes
  write_file(mount + "/app/memory.max", "lots\n");
  write_file(mount + "/app/memory.current", "");
  c = dos::detail::cgroup_memory_limit(root + "/mountinfo", root + "/cgroup");
  assert_true(c.limit == 0);
  // unreadable paths: nothing found
  c = dos::detail::cgroup_memory_limit(root + "/no-mountinfo", root + "/no-cgroup");
  assert_true(c.limit == 0);
}

/// The process's v1 memory cgroup folder, or "" (none, or v2 only).
std::string own_v1_memory_dir() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    const std::size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string ctl = line.substr(a + 1, b - a - 1);
    if (ctl == "memory" || ctl.find("memory,") == 0 || ctl.find(",memory") != std::string::npos) {
      const std::string path = line.substr(b + 1);
      return "/sys/fs/cgroup/memory" + (path == "/" ? std::string() : path);
    }
  }
  return "";
}

void test_live_v1_limit(void**) {
  const std::string own = own_v1_memory_dir();
  const std::string child = own + "/dos-test-host-memory-" + std::to_string(::getpid());
  if (own.empty() || ::access((own + "/memory.limit_in_bytes").c_str(), F_OK) != 0 ||
      ::mkdir(child.c_str(), 0755) != 0) {
    std::printf("  live part skipped: no v1 memory cgroup this process may make a child of (%s)\n",
                own.empty() ? "none" : own.c_str());
    skip();
  }
  const std::size_t limit = 3 * GB;
  {
    std::ofstream l(child + "/memory.limit_in_bytes");
    l << limit;
  }
  bool moved = false;
  {
    std::ofstream p(child + "/cgroup.procs");
    p << ::getpid();
    p.flush();
    moved = bool(p);
  }
  if (!moved) {
    ::rmdir(child.c_str());
    std::printf("  live part skipped: could not move this process into %s\n", child.c_str());
    skip();
  }
  dos::detail::CgroupLimit c;
  const std::size_t avail = dos::detail::host_memory_available(&c);
  std::string refused;
  try {
    dos::check_host_memory(4 * GB, "four gigabytes");
  } catch (const dos::ResourceError& e) {
    refused = e.what();
  }
  bool back = false;
  {  // back to where it was, then the child goes
    std::ofstream p(own + "/cgroup.procs");
    p << ::getpid();
    p.flush();
    back = bool(p);
  }
  const bool removed = ::rmdir(child.c_str()) == 0;
  std::printf("  in %s (limit 3 GB): available %.3f GB, cgroup limit %.3f GB\n  refused: %s\n", child.c_str(),
              avail / 1e9, c.limit / 1e9, refused.c_str());
  assert_true(back && removed);
  // the child's limit, or a tighter one above it (a job's own --mem), binds: named either way
  assert_true(avail <= limit);
  assert_true(c.limit > 0 && c.limit <= limit);
  assert_true(refused.find("four gigabytes needs 4.00 GB") != std::string::npos);
  assert_true(refused.find("cgroup") != std::string::npos && refused.find(c.dir) != std::string::npos);
  assert_true(refused.find("--mem") != std::string::npos);
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/dos-test-host-memory-XXXXXX";
  if (!::mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  g_tmp = tmpl;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_v1_nested_limits),
      cmocka_unit_test(test_v2_and_partial_mount),
      cmocka_unit_test(test_live_v1_limit),
  };
  const int failed = cmocka_run_group_tests(tests, nullptr, nullptr);
  const std::string rm = "rm -rf '" + g_tmp + "'";
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", g_tmp.c_str());
  return failed;
}
