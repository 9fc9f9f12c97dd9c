// dos-train's global-norm clipping (examples/dos-train/grad_norm.h) against independent references:
// the sum of squares against a plain long-double sum, over odd sizes and chunk tails, for fp32,
// fp16 and bf16 gradients; the same bits whatever the thread count; inf and NaN gradients give a
// non-finite sum; the rescale against the reference's own rounding of x * coef; the coefficient
// against torch.nn.utils.clip_grad_norm_'s formula.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cmocka_cpp.h"
#include "grad_norm.h"
#include "reference.h"

namespace {

using dos::DType;

/// n gradients of dtype t (their bytes) and the values they hold, as floats.
struct Grads {
  std::vector<unsigned char> bytes;
  std::vector<float> values;
};
Grads make(DType t, std::size_t n, unsigned seed) {
  Grads g;
  g.bytes.resize(n * (t == DType::fp32 ? 4 : 2));
  g.values.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = float(std::sin(0.731 * double(i) + seed) * (i % 11 == 0 ? 30.0 : 0.02));
    float v = x;
    if (t == DType::fp32) {
      std::memcpy(&g.bytes[4 * i], &x, 4);
    } else if (t == DType::fp16) {
      const uint16_t b = ref::float_to_f16_bits(x);
      std::memcpy(&g.bytes[2 * i], &b, 2);
      v = ref::f16_bits_to_float(b);
    } else {
      v = ref::round_to_bf16(x);
      uint32_t u;
      std::memcpy(&u, &v, 4);
      const uint16_t b = uint16_t(u >> 16);
      std::memcpy(&g.bytes[2 * i], &b, 2);
    }
    g.values[i] = v;
  }
  return g;
}

void test_sumsq_against_reference(void**) {
  const std::size_t sizes[] = {1, 7, 255, 256, 257, 65535, 65536, 65537, 3 * 65536 + 17};
  for (DType t : {DType::fp32, DType::fp16, DType::bf16})
    for (std::size_t n : sizes) {
      const Grads g = make(t, n, unsigned(n));
      long double want = 0;
      for (float v : g.values) want += (long double)v * v;
      omp_set_num_threads(1);
      const double one = dos_train::grad_sumsq_host(g.bytes.data(), t, n);
      omp_set_num_threads(2);
      const double two = dos_train::grad_sumsq_host(g.bytes.data(), t, n);
      assert_memory_equal(&one, &two, sizeof one);  // the same bits whatever the thread count
      if (std::fabs((long double)one - want) > 1e-13L * want) {
        std::fprintf(stderr, "%s n=%zu: %.17g, reference %.17Lg\n", dos::dtype_name(t), n, one, want);
        fail();
      }
    }
}

void test_nonfinite(void**) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> g(70000, 0.5f);
    g[69999] = bad;
    assert_false(std::isfinite(dos_train::grad_sumsq_host(g.data(), DType::fp32, g.size())));
  }
}

void test_scale_and_coefficient(void**) {
  const std::size_t n = 1000;
  for (DType t : {DType::fp32, DType::fp16, DType::bf16}) {
    Grads g = make(t, n, 3);
    const float coef = 0.3f;
    dos_train::scale_grads_host(g.bytes.data(), t, n, coef);
    for (std::size_t i = 0; i < n; ++i) {
      const float x = g.values[i] * coef;
      float want = x, got;
      if (t == DType::fp32) {
        std::memcpy(&got, &g.bytes[4 * i], 4);
      } else {
        uint16_t b;
        std::memcpy(&b, &g.bytes[2 * i], 2);
        got = t == DType::fp16 ? ref::f16_bits_to_float(b) : ref::bf16_bits_to_float(b);
        want = t == DType::fp16 ? ref::f16_bits_to_float(ref::float_to_f16_bits(x)) : ref::round_to_bf16(x);
      }
      assert_memory_equal(&got, &want, 4);
    }
  }
  // torch: clip_coef = max_norm / (total_norm + 1e-6), applied when below 1
  assert_true(dos_train::clip_coefficient(10.0, 1.0) == float(1.0 / (10.0 + 1e-6)));
  assert_true(dos_train::clip_coefficient(0.5, 1.0) == 1.0f);
  assert_true(dos_train::clip_coefficient(1.0, 1.0) == float(1.0 / (1.0 + 1e-6)));
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sumsq_against_reference),
      cmocka_unit_test(test_nonfinite),
      cmocka_unit_test(test_scale_and_coefficient),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
