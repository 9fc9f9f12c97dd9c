// The data-parallel loops of parallel.h: the gradients' reduce to each shard's owner and the
// parameters' broadcast from each owner, shard by shard, through Comm (host memory) or DeviceComm
// (GPU memory). Nothing here touches a GPU itself: the DeviceComm does.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel.h"

namespace dos {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void check_ranges(const std::vector<ShardRange>& ranges, int size, const char* what) {
  if (ranges.size() != std::size_t(size))
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(ranges.size()) + " ranges for " +
                                std::to_string(size) + " ranks (one per rank)");
}

void check_chunk(const std::vector<ShardRange>& ranges, int rank, std::size_t chunk, const char* what) {
  if (chunk == 0) throw std::invalid_argument(std::string(what) + ": chunk must be at least 1 element");
  if (rank < 0 || std::size_t(rank) >= ranges.size())
    throw std::invalid_argument(std::string(what) + ": rank " + std::to_string(rank) + " is out of range for " +
                                std::to_string(ranges.size()) + " ranges");
}

}  // namespace

std::vector<ShardRange> shard_ranges(std::size_t total, std::size_t world) {
  if (world == 0) throw std::invalid_argument("shard_ranges: world must be at least 1 rank");
  std::vector<ShardRange> out;
  for (std::size_t r = 0; r < world; ++r) out.push_back(shard_range(total, r, world));
  return out;
}

std::size_t largest_shard(const std::vector<ShardRange>& ranges) {
  std::size_t most = 0;
  for (const ShardRange& r : ranges) most = std::max(most, r.end - r.begin);
  return most;
}

double reduce_to_owners(Comm& comm, const std::vector<ShardRange>& ranges, const ContributionFn& contribution,
                        float* bucket, float* mine) {
  check_ranges(ranges, comm.size(), "reduce_to_owners");
  double comm_s = 0;
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const ShardRange& rr = ranges[r];
    contribution(bucket, rr);
    const auto t = Clock::now();
    comm.reduce_sum(bucket, mine, rr.end - rr.begin, int(r));
    comm_s += seconds_since(t);
  }
  return comm_s;
}

double reduce_to_owners(DeviceComm& comm, int rank, const std::vector<ShardRange>& ranges, std::size_t chunk,
                        const ContributionFn& contribution, float* send, float* recv, const ReceiveFn& receive) {
  check_chunk(ranges, rank, chunk, "reduce_to_owners");
  double comm_s = 0;
  for (std::size_t r = 0; r < ranges.size(); ++r)
    for (std::size_t off = 0; off < ranges[r].end - ranges[r].begin; off += chunk) {
      const std::size_t count = std::min(chunk, ranges[r].end - ranges[r].begin - off);
      const ShardRange piece{ranges[r].begin + off, ranges[r].begin + off + count};
      contribution(send, piece);
      const auto t = Clock::now();
      comm.reduce_sum(send, recv, count, int(r));
      comm_s += seconds_since(t);
      if (r == std::size_t(rank)) receive(recv, piece);
    }
  return comm_s;
}

double broadcast_from_owners(Comm& comm, const std::vector<ShardRange>& ranges, std::size_t elem_bytes,
                             const void* mine, void* bucket, const ShardFn& received) {
  check_ranges(ranges, comm.size(), "broadcast_from_owners");
  const std::size_t rank = std::size_t(comm.rank());
  const auto t = Clock::now();
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const std::size_t bytes = (ranges[r].end - ranges[r].begin) * elem_bytes;
    if (r == rank) std::memcpy(bucket, mine, bytes);
    comm.broadcast(bucket, bytes, int(r));
    if (received) received(bucket, ranges[r]);
  }
  return seconds_since(t);
}

double broadcast_from_owners(DeviceComm& comm, int rank, const std::vector<ShardRange>& ranges, std::size_t elem_bytes,
                             std::size_t chunk, const void* mine, void* bucket, const ShardFn& received) {
  check_chunk(ranges, rank, chunk, "broadcast_from_owners");
  const auto t = Clock::now();
  for (std::size_t r = 0; r < ranges.size(); ++r)
    for (std::size_t off = 0; off < ranges[r].end - ranges[r].begin; off += chunk) {
      const std::size_t count = std::min(chunk, ranges[r].end - ranges[r].begin - off);
      comm.broadcast(static_cast<const char*>(mine) + off * elem_bytes, bucket, count * elem_bytes, int(r));
      if (received) received(bucket, {ranges[r].begin + off, ranges[r].begin + off + count});
    }
  return seconds_since(t);
}

}  // namespace dos
