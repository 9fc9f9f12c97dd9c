// Checkpoint checksums (runtime/io/checksum.h): XXH3-64 as the xxHash library defines it (its
// published value for empty input), block checksums independent of how the byte stream is cut
// into pieces, a flipped bit changing exactly its block's checksum, and the model's parameter count
// checked for overflow (examples/dos-train/model_config.h: count_params).
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "checksum.h"
#include "cmocka_cpp.h"
#include "model_config.h"

namespace {

void test_known_value(void**) {
  // XXH3_64bits("", 0) with seed 0, from xxHash's reference test vectors
  assert_true(dos::checksum("", 0) == 0x2D06800538D394C2ull);
  assert_string_equal(dos::checksum_hex(0x2D06800538D394C2ull).c_str(), "0x2d06800538d394c2");
}

void test_blocks_independent_of_pieces(void**) {
  std::vector<unsigned char> data(10007);
  std::mt19937 rng(3);
  for (auto& b : data) b = (unsigned char)rng();
  const std::size_t block = 1024;
  const auto whole = dos::block_checksums({{data.data(), data.size()}}, block);
  assert_int_equal(whole.size(), (data.size() + block - 1) / block);
  for (std::size_t k = 0; k < whole.size(); ++k) {
    const std::size_t n = std::min(block, data.size() - k * block);
    assert_true(whole[k] == dos::checksum(data.data() + k * block, n));
  }
  // the same stream in uneven pieces (some empty, some across block boundaries)
  std::vector<std::pair<const void*, std::size_t>> pieces;
  const std::size_t cuts[] = {0, 1, 1, 700, 1024, 3000, 3000, 8191, 10007};
  for (std::size_t i = 0; i + 1 < sizeof cuts / sizeof cuts[0]; ++i)
    pieces.emplace_back(data.data() + cuts[i], cuts[i + 1] - cuts[i]);
  assert_true(dos::block_checksums(pieces, block) == whole);
  // a flipped bit changes its own block's checksum and no other
  data[5000] ^= 0x40;
  const auto flipped = dos::block_checksums({{data.data(), data.size()}}, block);
  for (std::size_t k = 0; k < whole.size(); ++k) assert_true((flipped[k] != whole[k]) == (k == 5000 / block));
  assert_true(throws_invalid_argument([&] { dos::block_checksums(pieces, 0); }));
  assert_int_equal(dos::block_checksums({}, block).size(), 0);
}

void test_parameter_count_overflow(void**) {
  dos_train::ModelConfig c = dos_train::preset("tiny");
  assert_int_equal(dos_train::count_params(dos_train::param_tensors(c), c.name), 541184);
  // dimensions each within range whose sum of products exceeds 2^64 (it wrapped to 16777216 once)
  c.arch = "llama";
  c.layers = 32768, c.hidden = 16777216, c.intermediate = 11184809, c.heads = 1, c.kv_heads = 1, c.vocab = 98304;
  assert_true(throws_invalid_argument([&] { dos_train::count_params(dos_train::param_tensors(c), c.name); }));
  // above 2^53 without overflowing 64 bits is refused too
  c.layers = 2000, c.hidden = 1 << 20, c.intermediate = 1 << 20, c.vocab = 1000;
  assert_true(throws_invalid_argument([&] { dos_train::count_params(dos_train::param_tensors(c), c.name); }));
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_value),
      cmocka_unit_test(test_blocks_independent_of_pieces),
      cmocka_unit_test(test_parameter_count_overflow),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
