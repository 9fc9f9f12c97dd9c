// Subgroup partitioning and data-parallel sharding: pure functions over element counts.
#pragma once

#include <cstddef>
#include <vector>

namespace dos {

/// A piece of one tensor inside a subgroup.
/// tensor: index in the caller's tensor list; tensor_offset: first element of the piece inside that
/// tensor; offset: position of the piece inside the subgroup; count: elements (> 0).
struct Piece {
  std::size_t tensor;
  std::size_t tensor_offset;
  std::size_t offset;
  std::size_t count;
};

/// One subgroup: the flat element range [begin, begin + size) of the concatenation of all tensors
/// (in the caller's order), and the tensor pieces that make it up, in order.
struct SubgroupLayout {
  std::size_t begin;
  std::size_t size;
  std::vector<Piece> pieces;
};

/// The most subgroups one optimizer may have (three StarPU tasks each).
constexpr std::size_t kMaxSubgroups = std::size_t(1) << 20;

/// The most elements one optimizer may hold in all, 2^53 (every count stays exact in a double).
constexpr std::size_t kMaxTotalElements = std::size_t(1) << 53;

/// Subgroups past which an Optimizer (verbose) warns that their per-subgroup cost (StarPU data
/// handles and tasks: about 28 KB of host memory and 0.14 ms of update phase each, measured on a
/// 2-core machine) outweighs their updates.
constexpr std::size_t kManySubgroups = 4096;

/// Cuts the concatenation of tensors of `numels` elements into subgroups of `subgroup_size`
/// elements; the last subgroup holds the remainder (so sizes are subgroup_size except possibly the
/// last, which is in [1, subgroup_size]). A subgroup may span several tensors and a tensor several
/// subgroups; tensors of 0 elements contribute no piece.
/// Throws std::invalid_argument when subgroup_size is 0, the total element count is 0 or above
/// kMaxTotalElements (counts that would wrap around included), or there would be more than
/// kMaxSubgroups subgroups.
std::vector<SubgroupLayout> partition_subgroups(const std::vector<std::size_t>& numels, std::size_t subgroup_size);

/// The element range [begin, end) owned by rank `rank` of `world` ranks when `total` elements are
/// split as evenly as possible (the first total % world ranks get one element more), as ZeRO
/// partitions a flat parameter buffer.
/// Throws std::invalid_argument when world is 0, rank >= world, or world > total (a rank would own
/// nothing).
struct ShardRange {
  std::size_t begin;
  std::size_t end;
};
ShardRange shard_range(std::size_t total, std::size_t rank, std::size_t world);

}  // namespace dos
