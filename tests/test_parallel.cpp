// The library's data-parallel helpers (runtime/parallel/parallel.h): rank_path, shard_ranges, and
// the host loops (reduce_to_owners, broadcast_from_owners) run by W threads over an in-process Comm,
// checked against sums and copies made element by element.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cmocka_cpp.h"
#include "parallel/parallel.h"

namespace {

/// What the ranks of one in-process job share: a barrier and one pointer per rank.
struct Shared {
  explicit Shared(int w) : world(w), slot(std::size_t(w)) {}
  int world;
  std::vector<const void*> slot;
  std::mutex m;
  std::condition_variable cv;
  int waiting = 0, generation = 0;
  void barrier() {
    std::unique_lock<std::mutex> lock(m);
    const int g = generation;
    if (++waiting == world) {
      waiting = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != g; });
    }
  }
};

/// One rank of an in-process job (a thread per rank): the collectives through shared pointers.
class ThreadComm : public dos::Comm {
 public:
  ThreadComm(Shared& s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_.world; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return s_.world; }
  void reduce_sum(const float* send, float* recv, std::size_t count, int root) override {
    s_.slot[std::size_t(rank_)] = send;
    s_.barrier();
    if (rank_ == root)
      for (std::size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int r = 0; r < s_.world; ++r) sum += static_cast<const float*>(s_.slot[std::size_t(r)])[i];
        recv[i] = sum;
      }
    s_.barrier();
  }
  void broadcast(void* buf, std::size_t bytes, int root) override {
    s_.slot[std::size_t(rank_)] = buf;
    s_.barrier();
    if (rank_ != root) std::memcpy(buf, s_.slot[std::size_t(root)], bytes);
    s_.barrier();
  }
  void all_gather(const void* shard, void* full, const std::vector<dos::ShardRange>& ranges,
                  std::size_t elem_bytes) override {
    s_.slot[std::size_t(rank_)] = shard;
    s_.barrier();
    for (std::size_t r = 0; r < ranges.size(); ++r)
      std::memcpy(static_cast<char*>(full) + ranges[r].begin * elem_bytes, s_.slot[r],
                  (ranges[r].end - ranges[r].begin) * elem_bytes);
    s_.barrier();
  }
  bool all_ok(bool ok) override { return ok; }
  [[noreturn]] void abort(int) override { std::abort(); }
  std::string name() const override { return "threads"; }

 private:
  Shared& s_;
  int rank_;
};

/// Rank r's contribution to global element i: small integers, so that every sum is exact.
float contribution(int r, std::size_t i) { return float((i * 7 + std::size_t(r) * 3) % 11); }

void test_rank_path(void**) {
  assert_string_equal(dos::rank_path("out/report.json", 3, 8).c_str(), "out/report.rank-00003-of-00008.json");
  assert_string_equal(dos::rank_path("report", 0, 2).c_str(), "report.rank-00000-of-00002");
  assert_string_equal(dos::rank_path("a.d/report", 1, 2).c_str(), "a.d/report.rank-00001-of-00002");
  assert_string_equal(dos::rank_path(".hidden", 0, 2).c_str(), ".hidden.rank-00000-of-00002");  // a leading dot only
  assert_string_equal(dos::rank_path("d/.hidden", 1, 2).c_str(), "d/.hidden.rank-00001-of-00002");
  assert_string_equal(dos::rank_path("d/.r.json", 1, 2).c_str(), "d/.r.rank-00001-of-00002.json");
}

void test_shard_ranges(void**) {
  const std::vector<dos::ShardRange> r = dos::shard_ranges(10, 3);
  assert_int_equal(r.size(), 3);
  assert_int_equal(r[0].end, 4);
  assert_int_equal(r[1].begin, 4);
  assert_int_equal(r[2].end, 10);
  assert_int_equal(dos::largest_shard(r), 4);
  assert_int_equal(dos::largest_shard({}), 0);
  assert_true(throws_invalid_argument([] { dos::shard_ranges(10, 0); }));
  assert_true(throws_invalid_argument([] { dos::shard_ranges(2, 3); }));
}

void test_host_loops(void**) {
  const int world = 3;
  const std::size_t total = 1001;  // shards of 334, 334, 333
  const std::vector<dos::ShardRange> ranges = dos::shard_ranges(total, world);
  Shared shared(world);
  std::vector<std::vector<float>> sums(world);
  std::vector<std::vector<short>> gathered(world, std::vector<short>(total, -1));
  std::vector<int> failures(world, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      ThreadComm comm(shared, r);
      const dos::ShardRange mine = ranges[std::size_t(r)];
      std::vector<float> bucket(dos::largest_shard(ranges)), sum(mine.end - mine.begin);
      const double s1 = dos::reduce_to_owners(
          comm, ranges,
          [&](float* dst, dos::ShardRange p) {
            for (std::size_t i = p.begin; i < p.end; ++i) dst[i - p.begin] = contribution(r, i);
          },
          bucket.data(), sum.data());
      sums[std::size_t(r)] = sum;
      // every rank's parameters are their global indices (as 16-bit values): the all-gather puts
      // each shard at its place
      std::vector<short> params(mine.end - mine.begin), bucket16(dos::largest_shard(ranges));
      for (std::size_t i = mine.begin; i < mine.end; ++i) params[i - mine.begin] = short(i);
      const double s2 = dos::broadcast_from_owners(comm, ranges, sizeof(short), params.data(), bucket16.data(),
                                                   [&](const void* data, dos::ShardRange p) {
                                                     std::memcpy(gathered[std::size_t(r)].data() + p.begin, data,
                                                                 (p.end - p.begin) * sizeof(short));
                                                   });
      if (!(s1 >= 0 && s2 >= 0)) failures[std::size_t(r)]++;
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    assert_int_equal(failures[std::size_t(r)], 0);
    const dos::ShardRange mine = ranges[std::size_t(r)];
    assert_int_equal(sums[std::size_t(r)].size(), mine.end - mine.begin);
    for (std::size_t i = mine.begin; i < mine.end; ++i) {
      float want = 0;
      for (int q = 0; q < world; ++q) want += contribution(q, i);
      assert_true(sums[std::size_t(r)][i - mine.begin] == want);
    }
    for (std::size_t i = 0; i < total; ++i) assert_int_equal(gathered[std::size_t(r)][i], short(i));
  }
}

void test_bad_loop_input(void**) {
  Shared shared(1);
  ThreadComm comm(shared, 0);
  float b = 0, m = 0;
  const std::vector<dos::ShardRange> two = dos::shard_ranges(4, 2);
  assert_true(throws_invalid_argument(
      [&] { dos::reduce_to_owners(comm, two, [](float*, dos::ShardRange) {}, &b, &m); }));
  assert_true(throws_invalid_argument([&] { dos::broadcast_from_owners(comm, two, 2, &b, &m); }));
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank_path),
      cmocka_unit_test(test_shard_ranges),
      cmocka_unit_test(test_host_loops),
      cmocka_unit_test(test_bad_loop_input),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
