// CPU Adam/AdamW on masters in compact form (compact_master.h for the layout and the contract):
// adam_cpu.cpp's step (adam_update, adam_step_inline.h) on masters rebuilt from P, lo and r.
// Its own translation unit, so that adam_cpu.cpp's kernels are compiled as they were.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "adam.h"
#include "adam_step_inline.h"
#include "compact_master.h"
#include "env_choice.h"

namespace dos {

namespace {
// The compact master (compact_master.h). Each block of kCompactBlock elements (starting at a multiple
// of 8, so that its r bits start at a byte) takes three steps:
//  1. its r bits are spread to one byte per element (a table lookup per byte of r, in cache);
//  2. one loop rebuilds each master from P, lo and its r byte, runs adam_update (adam_step_cpu's own
//     step), writes exp_avg, exp_avg_sq and the new P, and keeps the new master in a block in cache:
//     every array in memory is read in this one loop;
//  3. the split writes lo and the packed r bits from the kept masters and the new P (in cache: lo's
//     and r's lines were read in step 2 and 1).
// So the arrays in memory are gone over once, as adam_step_cpu goes over its own (a join and a split
// in passes of their own around adam_step_cpu's variant measured about the same on the 2-core
// development machine, which is not bound by memory). Integer operations besides the step: the
// same bits on every path.

/// spread_table()[b]: byte k of the result is bit k of b (little order, as the r bits are packed).
const std::uint64_t* spread_table() {
  static const auto table = [] {
    struct T {
      std::uint64_t v[256];
    } t{};
    for (unsigned b = 0; b < 256; ++b)
      for (unsigned k = 0; k < 8; ++k) t.v[b] |= std::uint64_t((b >> k) & 1u) << (8 * k);
    return t;
  }();
  return table.v;
}

/// rexp[i] = element i's r bit, for i < n, n rounded up to 8 (rexp holds that many bytes).
void spread_bits(const std::uint8_t* r, std::uint8_t* rexp, std::size_t n) {
  const std::uint64_t* t = spread_table();
  for (std::size_t j = 0; j < (n + 7) / 8; ++j) std::memcpy(rexp + 8 * j, &t[r[j]], 8);
}

/// The step over a block: omb1 (1 - beta1) passed apart, see compact_range. Into: exp_avg and
/// exp_avg_sq read from m_in and v_in and written to m and v (the out-of-place step; m_in and v_in
/// unused otherwise, the step reading and writing m and v in place).
template <DType G, bool L2, bool Into>
inline __attribute__((always_inline)) void compact_loop(std::uint16_t* __restrict p16, const std::uint16_t* __restrict lo,
                                                        const std::uint8_t* __restrict rexp, float* __restrict kept,
                                                        const float* __restrict m_in, const float* __restrict v_in,
                                                        float* __restrict m, float* __restrict v,
                                                        const void* __restrict g, std::size_t n, const float omb1,
                                                        const AdamStepParams& sp) {
  const float b2 = sp.beta2, omb2 = sp.one_minus_beta2;
  const float eps = sp.eps, step_size = sp.step_size, bc2s = sp.bias_correction2_sqrt;
  const float l2 = sp.l2, decay = sp.decay;
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = load_as_f32(g, G, i);
    float mi, vi;
    const float pi = detail::adam_update<L2>(bits_f32(compact_join(p16[i], lo[i], rexp[i])), mi, vi, gi,
                                             Into ? m_in[i] : m[i], Into ? v_in[i] : v[i], omb1, b2, omb2, eps,
                                             step_size, bc2s, l2, decay);
    m[i] = mi;
    v[i] = vi;
    kept[i] = pi;
    p16[i] = f32_to_bf16(pi);
  }
}

template <DType G, bool L2, bool Into>
inline __attribute__((always_inline)) void compact_range(std::uint16_t* p16, const std::uint16_t* lo,
                                                         const std::uint8_t* rexp, float* kept, const float* m_in,
                                                         const float* v_in, float* m, float* v, const void* g,
                                                         std::size_t n, const AdamStepParams& sp) {
  // lerp_torch's test of 1 - beta1 < 0.5 is the same on every element: GCC moves such a test out of
  // a loop only below a size that this loop exceeds, and left in, it keeps the loop from being
  // vectorised (4x slower). Made here, each copy of the loop knows its answer.
  const float omb1 = sp.one_minus_beta1;
  if (omb1 < 0.5f) compact_loop<G, L2, Into>(p16, lo, rexp, kept, m_in, v_in, m, v, g, n, omb1, sp);
  else compact_loop<G, L2, Into>(p16, lo, rexp, kept, m_in, v_in, m, v, g, n, omb1, sp);
}

// One target-cloned function per gradient type (fp16 gradients come as fp32 blocks, as in
// adam_step_cpu); m_in and v_in null: in place.
#define DOS_COMPACT_VARIANT(NAME, G)                                                                               \
  DOS_CLONES void NAME(std::uint16_t* p16, const std::uint16_t* lo, const std::uint8_t* rexp, float* kept,         \
                       const float* m_in, const float* v_in, float* m, float* v, const void* g, std::size_t n,     \
                       const AdamStepParams& sp) {                                                                 \
    const bool into = m_in != nullptr;                                                                             \
    if (sp.l2 != 0.0f) {                                                                                           \
      if (into) compact_range<G, true, true>(p16, lo, rexp, kept, m_in, v_in, m, v, g, n, sp);                     \
      else compact_range<G, true, false>(p16, lo, rexp, kept, nullptr, nullptr, m, v, g, n, sp);                   \
    } else {                                                                                                       \
      if (into) compact_range<G, false, true>(p16, lo, rexp, kept, m_in, v_in, m, v, g, n, sp);                    \
      else compact_range<G, false, false>(p16, lo, rexp, kept, nullptr, nullptr, m, v, g, n, sp);                  \
    }                                                                                                              \
  }
DOS_COMPACT_VARIANT(compact_f32, DType::fp32)
DOS_COMPACT_VARIANT(compact_bf16, DType::bf16)
#undef DOS_COMPACT_VARIANT

/// The split of elements [first, n) (first a multiple of 8) in plain code; the last, partial byte's
/// unused high bits written 0.
void compact_split_scalar(const float* __restrict m, const std::uint16_t* __restrict p, std::uint16_t* __restrict lo,
                          std::uint8_t* __restrict r, std::size_t first, std::size_t n) {
  for (std::size_t j = first; j < n; j += 8) {
    std::uint32_t b = 0;
    for (std::size_t i = j; i < std::min(n, j + 8); ++i) {
      const std::uint32_t u = f32_bits(m[i]);
      lo[i] = std::uint16_t(u);
      b |= compact_round_up(u, p[i]) << (i - j);
    }
    r[j / 8] = std::uint8_t(b);
  }
}
void compact_split_plain(const float* m, const std::uint16_t* p, std::uint16_t* lo, std::uint8_t* r, std::size_t n) {
  compact_split_scalar(m, p, lo, r, 0, n);
}
// GCC vectorises the plain split poorly (about one element per cycle): AVX-512 and AVX2 have their
// own, 16 and 8 elements (two bytes and one byte of r) at a time, the plain code taking the rest.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own avx512fintrin.h (a false positive)
__attribute__((target("avx512f"))) void compact_split_avx512(const float* m, const std::uint16_t* p, std::uint16_t* lo,
                                                             std::uint8_t* r, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(m + i);
    const __m512i pv = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i), _mm512_cvtepi32_epi16(u));  // the low halves
    const std::uint16_t bits16 = std::uint16_t(_mm512_cmpneq_epi32_mask(pv, _mm512_srli_epi32(u, 16)));
    std::memcpy(r + i / 8, &bits16, 2);  // element i + k: bit k (bytes in little order)
  }
  compact_split_scalar(m, p, lo, r, i, n);
}
#pragma GCC diagnostic pop
__attribute__((target("avx2"))) void compact_split_avx2(const float* m, const std::uint16_t* p, std::uint16_t* lo,
                                                        std::uint8_t* r, std::size_t n) {
  const __m256i low_mask = _mm256_set1_epi32(0xffff);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + i));
    const __m256i pv = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
    // the low halves, packed 32 -> 16 within each 128-bit lane, then the lanes' halves put together
    const __m256i packed = _mm256_packus_epi32(_mm256_and_si256(u, low_mask), _mm256_setzero_si256());
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + i),
                     _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));  // qwords 0 and 2
    const __m256i same = _mm256_cmpeq_epi32(pv, _mm256_srli_epi32(u, 16));
    r[i / 8] = std::uint8_t(~_mm256_movemask_ps(_mm256_castsi256_ps(same)) & 0xff);
  }
  compact_split_scalar(m, p, lo, r, i, n);
}

using CompactSplitFn = void (*)(const float*, const std::uint16_t*, std::uint16_t*, std::uint8_t*, std::size_t);
struct CompactSplit {
  CompactSplitFn fn;
  const char* isa;
};
/// The split for this processor, chosen once: AVX-512, AVX2 or plain code. DOS_COMPACT_ISA in the
/// environment picks another the processor has (tests: scalar, avx2 or avx512f); a value that is not
/// one of them, or a path the processor lacks, is named in a warning on standard error and the best
/// path it has is used: the same bits on every path.
const CompactSplit& compact_split() {
  static const CompactSplit c = [] {
    __builtin_cpu_init();
    const bool has[3] = {true, bool(__builtin_cpu_supports("avx2")), bool(__builtin_cpu_supports("avx512f"))};
    const char* const isas[3] = {"scalar", "avx2", "avx512f"};
    switch (detail::isa_choice("DOS_COMPACT_ISA", isas, has, "the compact master's split uses")) {
      case 2: return CompactSplit{compact_split_avx512, "avx512f"};
      case 1: return CompactSplit{compact_split_avx2, "avx2"};
      default: return CompactSplit{compact_split_plain, "scalar"};
    }
  }();
  return c;
}

/// Elements per block of adam_step_compact_cpu inside a work item (a multiple of 8): the kept
/// masters (8 KiB), the spread r bits and an fp16 gradient's fp32 block stay in the L1 cache.
constexpr std::size_t kCompactBlock = 2048;
static_assert(kCpuWorkItem % kCompactBlock == 0 && kCompactBlock % 16 == 0, "blocks start at a byte of r");
}  // namespace

namespace {
/// A compact state read by the out-of-place step (adam_step_compact_into_cpu): its arrays, as
/// adam_step_compact_cpu's.
struct CompactSource {
  const std::uint16_t* lo;
  const std::uint8_t* r;
  const float* m;
  const float* v;
};

/// adam_step_compact_cpu, or with `in` its out-of-place form: each block stepped from `in` (read
/// where it lies) into buffers of the thread's own and streamed out to the output arrays
/// (compact_into_writes "stream"), or its lo, r bytes, exp_avg and exp_avg_sq copied into the output
/// arrays (in cache) and stepped there ("cache").
void compact_step(const CompactSource* in, std::uint16_t* param, std::uint16_t* master_lo,
                  std::uint8_t* round_up_bits, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                  std::size_t n, const AdamStepParams& sp) {
  const bool f16_in = grad_dtype == DType::fp16;
  const auto step = f16_in || grad_dtype == DType::fp32 ? compact_f32 : compact_bf16;
  const CompactSplitFn split = compact_split().fn;
  const std::size_t gsz = dtype_size(grad_dtype);
  const std::size_t nchunks = (n + kCpuWorkItem - 1) / kCpuWorkItem;
  const bool dynamic = std::strcmp(cpu_adam_schedule(), "dynamic") == 0;
  const bool streams = in && std::strcmp(compact_into_writes(), "stream") == 0;
#pragma omp parallel if (nchunks > 1)
  {
    alignas(64) float kept[kCompactBlock];
    alignas(64) float gbuf[kCompactBlock];
    alignas(64) std::uint8_t rexp[kCompactBlock];
    // the streamed out-of-place step's new block of state (about 20 KiB, in cache beside the above)
    alignas(64) std::uint16_t lo_blk[kCompactBlock];
    alignas(64) std::uint8_t r_blk[kCompactBlock / 8];
    alignas(64) float m_blk[kCompactBlock];
    alignas(64) float v_blk[kCompactBlock];
    // each work item owns its elements' bytes of r (kCpuWorkItem is a multiple of 8)
    auto chunk = [&](std::size_t c) {
      const std::size_t end = std::min(n, (c + 1) * kCpuWorkItem);
      for (std::size_t off = c * kCpuWorkItem; off < end; off += kCompactBlock) {
        const std::size_t len = std::min(kCompactBlock, end - off);
        const void* g = static_cast<const char*>(grad) + off * gsz;
        if (f16_in) {  // one work item or less: no parallel region of its own
          convert_to_f32_cpu(g, DType::fp16, gbuf, len);
          g = gbuf;
        }
        std::uint16_t* p = param + off;
        std::uint16_t* lo = master_lo + off;
        std::uint8_t* r = round_up_bits + off / 8;
        if (streams) {  // the old block stepped into the thread's buffers, then streamed out
          const std::size_t rbytes = (len + 7) / 8;
          spread_bits(in->r + off / 8, rexp, len);
          step(p, in->lo + off, rexp, kept, in->m + off, in->v + off, m_blk, v_blk, g, len, sp);
          split(kept, p, lo_blk, r_blk, len);
          stream_copy_cpu(lo, lo_blk, len * sizeof(std::uint16_t));
          stream_copy_cpu(r, r_blk, rbytes);
          stream_copy_cpu(exp_avg + off, m_blk, len * sizeof(float));
          stream_copy_cpu(exp_avg_sq + off, v_blk, len * sizeof(float));
          continue;
        }
        if (in) {  // the block's old state into the output, where the step then reads it from cache
          std::memcpy(lo, in->lo + off, len * sizeof(std::uint16_t));
          std::memcpy(r, in->r + off / 8, (len + 7) / 8);
          std::memcpy(exp_avg + off, in->m + off, len * sizeof(float));
          std::memcpy(exp_avg_sq + off, in->v + off, len * sizeof(float));
        }
        spread_bits(r, rexp, len);
        step(p, lo, rexp, kept, nullptr, nullptr, exp_avg + off, exp_avg_sq + off, g, len, sp);
        split(kept, p, lo, r, len);
      }
    };
    if (dynamic) {
#pragma omp for schedule(dynamic, 1)
      for (std::size_t c = 0; c < nchunks; ++c) chunk(c);
    } else {
#pragma omp for schedule(static)
      for (std::size_t c = 0; c < nchunks; ++c) chunk(c);
    }
    if (streams) _mm_sfence();  // this thread's non-temporal stores before anyone reads the output
  }
}
}  // namespace

const char* compact_into_writes() {
  static const bool streams =
      detail::env_choice("DOS_COMPACT_INTO", {"stream", "cache"}, 0, "stream is used (the default)") == 0;
  return streams ? "stream" : "cache";
}

void adam_step_compact_cpu(std::uint16_t* param, std::uint16_t* master_lo, std::uint8_t* round_up_bits,
                           float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype, std::size_t n,
                           const AdamStepParams& sp) {
  compact_step(nullptr, param, master_lo, round_up_bits, exp_avg, exp_avg_sq, grad, grad_dtype, n, sp);
}

void adam_step_compact_into_cpu(const std::uint16_t* in_lo, const std::uint8_t* in_r, const float* in_exp_avg,
                                const float* in_exp_avg_sq, std::uint16_t* param, std::uint16_t* master_lo,
                                std::uint8_t* round_up_bits, float* exp_avg, float* exp_avg_sq, const void* grad,
                                DType grad_dtype, std::size_t n, const AdamStepParams& sp) {
  const CompactSource in{in_lo, in_r, in_exp_avg, in_exp_avg_sq};
  compact_step(&in, param, master_lo, round_up_bits, exp_avg, exp_avg_sq, grad, grad_dtype, n, sp);
}

void adam_step_compact_cpu_at(std::uint16_t* param, std::uint16_t* master_lo, std::uint8_t* round_up_bits,
                              std::size_t first, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                              std::size_t n, const AdamStepParams& sp) {
  if (n == 0) return;
  // the head, up to the next byte of r: its bits moved to a byte of their own from bit 0, and back
  const unsigned shift = unsigned(first % 8);
  const std::size_t head = shift == 0 ? 0 : std::min<std::size_t>(n, 8 - shift);
  if (head > 0) {
    std::uint8_t* at = round_up_bits + first / 8;
    std::uint8_t b = std::uint8_t(*at >> shift);
    adam_step_compact_cpu(param, master_lo, &b, exp_avg, exp_avg_sq, grad, grad_dtype, head, sp);
    const std::uint8_t mask = std::uint8_t(((1u << head) - 1) << shift);
    *at = std::uint8_t((*at & ~mask) | ((unsigned(b) << shift) & mask));
    if (head == n) return;
  }
  // the rest starts at a byte: the kernel itself, the last byte's bits beyond the range kept
  const std::size_t rest = n - head, tail = rest % 8;
  std::uint8_t* r = round_up_bits + (first + head) / 8;
  const std::uint8_t beyond = tail ? r[rest / 8] : 0;
  adam_step_compact_cpu(param + head, master_lo + head, r, exp_avg + head, exp_avg_sq + head,
                        static_cast<const char*>(grad) + head * dtype_size(grad_dtype), grad_dtype, rest, sp);
  if (tail) {
    const std::uint8_t low = std::uint8_t((1u << tail) - 1);
    r[rest / 8] = std::uint8_t((r[rest / 8] & low) | (beyond & ~low));
  }
}

const char* compact_master_isa() { return compact_split().isa; }

}  // namespace dos
