#include "partition.h"

#include <stdexcept>
#include <string>

namespace dos {

std::vector<SubgroupLayout> partition_subgroups(const std::vector<std::size_t>& numels, std::size_t subgroup_size) {
  if (subgroup_size == 0)
    throw std::invalid_argument("subgroup size must be at least 1 element (got 0)");
  std::size_t total = 0;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] > kMaxTotalElements - total)
      throw std::invalid_argument("the tensors hold more than 2^53 elements in all (tensor " + std::to_string(i) +
                                  " has " + std::to_string(numels[i]) + "): give the element counts of real tensors");
    total += numels[i];
  }
  if (total == 0) throw std::invalid_argument("no parameters to optimize: every tensor has 0 elements");
  if ((total + subgroup_size - 1) / subgroup_size > kMaxSubgroups)
    throw std::invalid_argument("subgroups of " + std::to_string(subgroup_size) + " elements cut " + std::to_string(total) +
                                " parameters into more than " + std::to_string(kMaxSubgroups) +
                                " subgroups (three StarPU tasks each): use a subgroup size of at least " +
                                std::to_string((total + kMaxSubgroups - 1) / kMaxSubgroups));

  std::vector<SubgroupLayout> out;
  out.reserve((total + subgroup_size - 1) / subgroup_size);
  std::size_t t = 0, t_off = 0;  // cursor: tensor index and offset inside it
  for (std::size_t begin = 0; begin < total; begin += subgroup_size) {
    SubgroupLayout sg;
    sg.begin = begin;
    sg.size = total - begin < subgroup_size ? total - begin : subgroup_size;
    std::size_t filled = 0;
    while (filled < sg.size) {
      while (t_off == numels[t]) {  // skip finished (and empty) tensors
        ++t;
        t_off = 0;
      }
      const std::size_t left = numels[t] - t_off;
      const std::size_t take = left < sg.size - filled ? left : sg.size - filled;
      sg.pieces.push_back(Piece{t, t_off, filled, take});
      filled += take;
      t_off += take;
    }
    out.push_back(std::move(sg));
  }
  return out;
}

ShardRange shard_range(std::size_t total, std::size_t rank, std::size_t world) {
  if (world == 0) throw std::invalid_argument("shard: the number of ranks W must be at least 1");
  if (rank >= world)
    throw std::invalid_argument("shard: rank " + std::to_string(rank) + " is out of range for " +
                                std::to_string(world) + " ranks (ranks are 0.." + std::to_string(world - 1) + ")");
  if (world > total)
    throw std::invalid_argument("shard: " + std::to_string(world) + " ranks for " + std::to_string(total) +
                                " parameters would leave a rank with nothing");
  const std::size_t base = total / world, extra = total % world;
  const std::size_t begin = rank * base + (rank < extra ? rank : extra);
  return ShardRange{begin, begin + base + (rank < extra ? 1 : 0)};
}

}  // namespace dos
