// Subgroup partitioning and sharding: edge cases, checked against an element-by-element walk.
#include <stdexcept>
#include <vector>

#include "cmocka_cpp.h"
#include "partition.h"

namespace {

// Independent check: walking the pieces of every subgroup in order must visit every element of
// every tensor exactly once, in flat order, and sizes must be S except the last.
void check_cover(const std::vector<size_t>& numels, size_t S) {
  const auto sgs = dos::partition_subgroups(numels, S);
  size_t total = 0;
  for (size_t n : numels) total += n;
  assert_int_equal(sgs.size(), (total + S - 1) / S);
  // flat index -> (tensor, offset) by brute force
  std::vector<std::pair<size_t, size_t>> owner;
  for (size_t t = 0; t < numels.size(); ++t)
    for (size_t i = 0; i < numels[t]; ++i) owner.push_back({t, i});
  size_t flat = 0;
  for (size_t s = 0; s < sgs.size(); ++s) {
    assert_int_equal(sgs[s].begin, flat);
    assert_int_equal(sgs[s].size, s + 1 < sgs.size() ? S : total - S * (sgs.size() - 1));
    size_t inside = 0;
    for (const dos::Piece& p : sgs[s].pieces) {
      assert_true(p.count > 0);
      assert_int_equal(p.offset, inside);
      for (size_t k = 0; k < p.count; ++k) {
        assert_int_equal(owner[flat].first, p.tensor);
        assert_int_equal(owner[flat].second, p.tensor_offset + k);
        ++flat;
      }
      inside += p.count;
    }
    assert_int_equal(inside, sgs[s].size);
  }
  assert_int_equal(flat, total);
}

void test_cover_cases(void**) {
  check_cover({10}, 3);                     // remainder 1
  check_cover({12}, 4);                     // exact multiple
  check_cover({5}, 100);                    // one subgroup smaller than S
  check_cover({1}, 1);                      // single element
  check_cover({3, 0, 4, 0, 0, 9}, 5);       // empty tensors skipped, subgroups span tensors
  check_cover({1, 1, 1, 1, 1, 1, 1}, 3);    // many tiny tensors in one subgroup
  check_cover({17, 1025, 7, 15, 16}, 16);   // odd sizes and SIMD-width tails
  check_cover({1000}, 1);                   // subgroup of one element
}

void test_subgroup_spanning_tensors(void**) {
  const auto sgs = dos::partition_subgroups({3, 4}, 5);
  assert_int_equal(sgs.size(), 2);
  assert_int_equal(sgs[0].pieces.size(), 2);
  assert_int_equal(sgs[0].pieces[1].tensor, 1);
  assert_int_equal(sgs[0].pieces[1].count, 2);
  assert_int_equal(sgs[1].pieces.size(), 1);
  assert_int_equal(sgs[1].pieces[0].tensor_offset, 2);
  assert_int_equal(sgs[1].size, 2);
}

void test_bad_partition_input(void**) {
  assert_true(throws_invalid_argument([&] { dos::partition_subgroups({10}, 0); }));
  assert_true(throws_invalid_argument([&] { dos::partition_subgroups({0, 0}, 4); }));
  // one subgroup too many
  assert_true(throws_invalid_argument([&] { dos::partition_subgroups({dos::kMaxSubgroups * 2 + 1}, 2); }));
  // counts whose sum wraps around (it would look like 1 element, or 4) or passes 2^53
  const std::size_t top = ~std::size_t(0);
  assert_true(throws_invalid_argument([&] { dos::partition_subgroups({top, 2}, std::size_t(1) << 40); }));
  assert_true(throws_invalid_argument([&] { dos::partition_subgroups({top - 3, 8}, std::size_t(1) << 40); }));
  assert_true(throws_invalid_argument(
      [&] { dos::partition_subgroups({dos::kMaxTotalElements, 1}, std::size_t(1) << 40); }));
  assert_int_equal(dos::partition_subgroups({dos::kMaxTotalElements - 1, 1}, std::size_t(1) << 40).size(), 8192);
  assert_int_equal(dos::partition_subgroups({dos::kMaxSubgroups * 2}, 2).size(), dos::kMaxSubgroups);
}

void test_shard_range(void**) {
  // 10 elements over 3 ranks: 4, 3, 3, contiguous and covering
  const dos::ShardRange r0 = dos::shard_range(10, 0, 3), r1 = dos::shard_range(10, 1, 3), r2 = dos::shard_range(10, 2, 3);
  assert_int_equal(r0.begin, 0);
  assert_int_equal(r0.end, 4);
  assert_int_equal(r1.begin, 4);
  assert_int_equal(r1.end, 7);
  assert_int_equal(r2.begin, 7);
  assert_int_equal(r2.end, 10);
  const dos::ShardRange one = dos::shard_range(5, 0, 1);
  assert_int_equal(one.end - one.begin, 5);
  for (auto bad : {std::vector<size_t>{10, 3, 3}, {10, 0, 0}, {2, 0, 3}})
    assert_true(throws_invalid_argument([&] { dos::shard_range(bad[0], bad[1], bad[2]); }));
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cover_cases),
      cmocka_unit_test(test_subgroup_spanning_tensors),
      cmocka_unit_test(test_bad_partition_input),
      cmocka_unit_test(test_shard_range),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
