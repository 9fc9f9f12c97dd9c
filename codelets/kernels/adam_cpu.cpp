// CPU Adam/AdamW and conversion kernels (see adam.h for the formula and the contract).
//
// Vectorisation: the element loop is written once (adam_loop, its step adam_update shared with the
// compact master's kernel in adam_step_inline.h) and compiled by GCC for AVX-512, AVX2 and baseline
// x86-64 through target_clones (DOS_CLONES); the loader picks the best at run time, so one
// binary serves the CI machine and the GPU machine. Tails need no special code: the compiler's
// vector loop has its own scalar epilogue. Built with -ffp-contract=off so that every variant,
// and the CUDA kernel (built with --fmad=false), evaluate the same fp32 operations in the same
// order: results do not depend on the instruction set or on where a subgroup ran.
// OpenMP splits the array into chunks across the calling thread's team.
#include <cstring>

#include "adam.h"
#include "adam_step_inline.h"
#include "env_choice.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace dos {

AdamStepParams make_adam_step_params(const AdamHyper& h, std::int64_t step) {
  AdamStepParams sp;
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  sp.beta1 = float(h.beta1);
  sp.one_minus_beta1 = float(1.0 - h.beta1);
  sp.beta2 = float(h.beta2);
  sp.one_minus_beta2 = float(1.0 - h.beta2);
  sp.eps = float(h.eps);
  sp.step_size = float(h.lr / bc1);
  sp.bias_correction2_sqrt = float(std::sqrt(bc2));
  sp.l2 = h.decoupled ? 0.0f : float(h.weight_decay);
  sp.decay = h.decoupled ? float(1.0 - h.lr * h.weight_decay) : 1.0f;
  return sp;
}

namespace {

constexpr std::size_t kChunk = kCpuWorkItem;  // elements per OpenMP work item (adam.h)
// elements per block of the out-of-place step's new state ("direct"): 3 x 8 KiB (in L1 on the bf16 and fp32 paths) beside the
// gradient's and the copy's lines
constexpr std::size_t kIntoBlock = 2048;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own avx512fintrin.h (a false positive)
// fp16 <-> fp32 in blocks with the F16C / AVX-512 conversion instructions (vcvtph2ps, vcvtps2ph
// with round to nearest even: the same bits as dtype.h's integer code, which GCC cannot vectorise).
// Chosen once at run time from what the processor has; tails go through dtype.h.
__attribute__((target("avx512f"))) void f16_to_f32_avx512(const std::uint16_t* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  for (; i < n; ++i) d[i] = f16_to_f32(s[i]);
}
__attribute__((target("avx512f"))) void f32_to_f16_avx512(const float* s, std::uint16_t* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = f32_to_f16(s[i]);
}
__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const std::uint16_t* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = f16_to_f32(s[i]);
}
__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* s, std::uint16_t* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = f32_to_f16(s[i]);
}
#pragma GCC diagnostic pop

void f16_to_f32_scalar(const std::uint16_t* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
}
void f32_to_f16_scalar(const float* s, std::uint16_t* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
}

using F16ToF32 = void (*)(const std::uint16_t*, float*, std::size_t);
using F32ToF16 = void (*)(const float*, std::uint16_t*, std::size_t);
struct F16Converters {
  F16ToF32 to_f32;
  F32ToF16 to_f16;
  const char* isa;
};
const F16Converters& f16_converters() {
  static const F16Converters c = [] {
    __builtin_cpu_init();
    const bool has[3] = {true, __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c"),
                         bool(__builtin_cpu_supports("avx512f"))};
    // tests: each path the processor has; an unknown request: the best path, as unset; a path the
    // processor lacks is said, not refused: every path gives the same bits
    const char* const isas[3] = {"scalar", "f16c", "avx512f"};
    switch (detail::isa_choice("DOS_F16_ISA", isas, has, "the fp16 conversions use")) {
      case 2: return F16Converters{f16_to_f32_avx512, f32_to_f16_avx512, "avx512f"};
      case 1: return F16Converters{f16_to_f32_f16c, f32_to_f16_f16c, "f16c"};
      default: return F16Converters{f16_to_f32_scalar, f32_to_f16_scalar, "scalar"};
    }
  }();
  return c;
}

/// The element loop: in place (Into false: the state read from and written to p, m, v; pin, min,
/// vin unused) or out of place (the state read from pin, min, vin, not overlapping p, m, v). omb1
/// is 1 - beta1, passed apart (see adam_range).
template <DType G, DType P, bool WriteParam, bool L2, bool Into>
inline __attribute__((always_inline)) void adam_loop(const float* __restrict pin, const float* __restrict min,
                                                     const float* __restrict vin, float* __restrict p,
                                                     float* __restrict m, float* __restrict v,
                                                     const void* __restrict g, void* __restrict out, std::size_t n,
                                                     float omb1, const AdamStepParams& sp) {
  const float b2 = sp.beta2, omb2 = sp.one_minus_beta2;
  const float eps = sp.eps, step_size = sp.step_size, bc2s = sp.bias_correction2_sqrt;
  const float l2 = sp.l2, decay = sp.decay;
  for (std::size_t i = 0; i < n; ++i) {
    float gi = load_as_f32(g, G, i);
    float mi, vi;
    const float pi = detail::adam_update<L2>(Into ? pin[i] : p[i], mi, vi, gi, Into ? min[i] : m[i],
                                             Into ? vin[i] : v[i], omb1, b2, omb2, eps, step_size, bc2s, l2, decay);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (WriteParam) store_from_f32(out, P, i, pi);
  }
}
/// adam_loop with lerp_torch's test of 1 - beta1 < 0.5 made once: it is the same on every element.
/// GCC moved it out of the in-place loop by itself but not out of the out-of-place one, whose vector
/// form it then never ran (measured 2.1x slower than copying the state in and stepping it in place).
/// Made here, each copy of the loop knows its answer.
template <DType G, DType P, bool WriteParam, bool L2, bool Into>
inline __attribute__((always_inline)) void adam_range(const float* pin, const float* min, const float* vin, float* p,
                                                      float* m, float* v, const void* g, void* out, std::size_t n,
                                                      const AdamStepParams& sp) {
  const float omb1 = sp.one_minus_beta1;
  if (omb1 < 0.5f) adam_loop<G, P, WriteParam, L2, Into>(pin, min, vin, p, m, v, g, out, n, omb1, sp);
  else adam_loop<G, P, WriteParam, L2, Into>(pin, min, vin, p, m, v, g, out, n, omb1, sp);
}

// Two non-template, target-cloned functions per (grad dtype, param dtype) pair: in place, and out of
// place (NAME_into).
#define DOS_ADAM_VARIANT(NAME, G, P, W)                                                                        \
  DOS_CLONES void NAME(float* p, float* m, float* v, const void* g, void* out, std::size_t n,                \
                       const AdamStepParams& sp) {                                                             \
    if (sp.l2 != 0.0f) adam_range<G, P, W, true, false>(nullptr, nullptr, nullptr, p, m, v, g, out, n, sp);  \
    else adam_range<G, P, W, false, false>(nullptr, nullptr, nullptr, p, m, v, g, out, n, sp);                 \
  }                                                                                                            \
  DOS_CLONES void NAME##_into(const float* pin, const float* min, const float* vin, float* p, float* m, float* v, \
                              const void* g, void* out, std::size_t n, const AdamStepParams& sp) {             \
    if (sp.l2 != 0.0f) adam_range<G, P, W, true, true>(pin, min, vin, p, m, v, g, out, n, sp);               \
    else adam_range<G, P, W, false, true>(pin, min, vin, p, m, v, g, out, n, sp);                              \
  }
DOS_ADAM_VARIANT(adam_f32_none, DType::fp32, DType::fp32, false)
DOS_ADAM_VARIANT(adam_f32_f32, DType::fp32, DType::fp32, true)
DOS_ADAM_VARIANT(adam_f32_f16, DType::fp32, DType::fp16, true)
DOS_ADAM_VARIANT(adam_f32_bf16, DType::fp32, DType::bf16, true)
DOS_ADAM_VARIANT(adam_f16_none, DType::fp16, DType::fp32, false)
DOS_ADAM_VARIANT(adam_f16_f32, DType::fp16, DType::fp32, true)
DOS_ADAM_VARIANT(adam_f16_f16, DType::fp16, DType::fp16, true)
DOS_ADAM_VARIANT(adam_bf16_none, DType::bf16, DType::fp32, false)
DOS_ADAM_VARIANT(adam_bf16_f32, DType::bf16, DType::fp32, true)
DOS_ADAM_VARIANT(adam_bf16_bf16, DType::bf16, DType::bf16, true)
DOS_ADAM_VARIANT(adam_f16_bf16, DType::fp16, DType::bf16, true)
DOS_ADAM_VARIANT(adam_bf16_f16, DType::bf16, DType::fp16, true)
#undef DOS_ADAM_VARIANT

using AdamFn = void (*)(float*, float*, float*, const void*, void*, std::size_t, const AdamStepParams&);
using AdamIntoFn = void (*)(const float*, const float*, const float*, float*, float*, float*, const void*, void*,
                            std::size_t, const AdamStepParams&);
/// One (gradient type, parameter-copy type) pair's element loops: in place and out of place.
struct AdamFns {
  AdamFn in_place;
  AdamIntoFn into;
};

/// The variants for gradient type g and parameter-copy type p (write: whether a copy is written).
AdamFns pick_adam(DType g, DType p, bool write) {
#define DOS_FNS(NAME) AdamFns{NAME, NAME##_into}
  static const AdamFns table[3][4] = {
      // param: fp32, fp16, bf16, none
      {DOS_FNS(adam_f32_f32), DOS_FNS(adam_f32_f16), DOS_FNS(adam_f32_bf16), DOS_FNS(adam_f32_none)},
      {DOS_FNS(adam_f16_f32), DOS_FNS(adam_f16_f16), DOS_FNS(adam_f16_bf16), DOS_FNS(adam_f16_none)},
      {DOS_FNS(adam_bf16_f32), DOS_FNS(adam_bf16_f16), DOS_FNS(adam_bf16_bf16), DOS_FNS(adam_bf16_none)},
  };
#undef DOS_FNS
  return table[int(g)][write ? int(p) : 3];
}

// Copies `bytes` with non-temporal stores: no read of the destination's lines before they are
// written (the read for ownership of an ordinary store), and no eviction of what the cache holds.
// What the update saves on each array it writes but does not read: the parameter copy (2 of the
// 30 bytes per parameter that an update in place with 16-bit gradient and copy moves, 2 of 32 with
// an fp32 gradient) and, out of place, the new state (12 of 40 or 42). The head up to the vector's
// alignment and the tail go through memcpy; Lines streams the whole vectors between them (d aligned
// to W, n a multiple of W), one function per instruction set. Chosen once from what the processor
// has; the caller fences (_mm_sfence) before the data is used by another thread or a device.
__attribute__((target("avx512f"))) void stream_lines_avx512(char* d, const char* s, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(reinterpret_cast<const void*>(s + i)));
}
__attribute__((target("avx"))) void stream_lines_avx(char* d, const char* s, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
}
template <std::size_t W, void (*Lines)(char*, const char*, std::size_t)>
void stream_bytes(void* dst, const void* src, std::size_t n) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const std::size_t misalign = reinterpret_cast<std::uintptr_t>(d) % W;
  const std::size_t head = std::min(n, misalign ? W - misalign : 0);
  const std::size_t body = (n - head) / W * W;
  std::memcpy(d, s, head);
  Lines(d + head, s + head, body);
  std::memcpy(d + head + body, s + head + body, n - head - body);
}
void stream_bytes_plain(void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); }
using StreamBytes = void (*)(void*, const void*, std::size_t);
struct Streamer {
  StreamBytes fn;
  const char* name;
};
/// The non-temporal copy for this processor. DOS_NT_STORES in the environment picks another: "0"
/// memcpy (a measurement switch), "avx" the 256-bit path where the processor has AVX (tests); any
/// other value is named in a warning on standard error and the default used; the same bits every way.
const Streamer& streamer() {
  static const Streamer best = [] {
    __builtin_cpu_init();
    const int want = detail::env_choice("DOS_NT_STORES", {"0", "avx"}, -1, "the default stores are used");
    if (want == 0) return Streamer{&stream_bytes_plain, "cached (memcpy)"};
    if (__builtin_cpu_supports("avx512f") && want != 1) return Streamer{&stream_bytes<64, stream_lines_avx512>, "non-temporal avx512f"};
    if (__builtin_cpu_supports("avx")) return Streamer{&stream_bytes<32, stream_lines_avx>, "non-temporal avx"};
    return Streamer{&stream_bytes_plain, "cached (memcpy)"};
  }();
  return best;
}

/// Whether adam_step_into_cpu steps the old state from where it lies into blocks of the thread's own
/// (the default, "direct") rather than copying it into them first and stepping it there ("copy"):
/// DOS_ADAM_INTO in the environment, read once (a measurement switch; another value warns on
/// standard error and gives the default). The same bits either way.
bool adam_into_direct() {
  static const bool direct =
      detail::env_choice("DOS_ADAM_INTO", {"direct", "copy"}, 0, "direct is used (the default)") == 0;
  return direct;
}

/// Whether adam_step_cpu hands its work items out one at a time (the default) rather than one
/// contiguous range per thread: DOS_CPU_SCHEDULE=static in the environment picks the latter (a
/// measurement switch, read once; "dynamic" or none: dynamic; any other value: dynamic, with a
/// warning on standard error). The same bits either way.
bool cpu_adam_dynamic_schedule() {
  static const bool dynamic = detail::env_choice("DOS_CPU_SCHEDULE", {"static", "dynamic"}, 1, "dynamic is used") == 1;
  return dynamic;
}

#define DOS_CONVERT_VARIANT(NAME, S)                                           \
  DOS_CLONES void NAME(const void* src, float* __restrict dst, std::size_t n) { \
    for (std::size_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, S, i);       \
  }
DOS_CONVERT_VARIANT(convert_bf16, DType::bf16)
DOS_CONVERT_VARIANT(convert_f32, DType::fp32)
#undef DOS_CONVERT_VARIANT

}  // namespace

namespace {
/// adam_step_cpu and adam_step_into_cpu: the state read from *_in and written to master, exp_avg,
/// exp_avg_sq (the same arrays, in place, when into is false). Out of place, each chunk's state is
/// stepped from where it lies into blocks of kIntoBlock elements of the thread's own (24 KiB) by the
/// out-of-place element loop ("direct"), or, under DOS_ADAM_INTO=copy, copied whole into
/// cache-resident blocks and updated there in place ("copy"); either way the new state is streamed
/// out with non-temporal stores, so the bytes moved are those of the update in place, and the
/// element loops run the same adam_update (the same bits).
void adam_step_any(bool into, const float* master_in, const float* exp_avg_in, const float* exp_avg_sq_in,
                   float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                   void* param_out, DType param_dtype, std::size_t n, const AdamStepParams& sp) {
  // fp16 gradients or parameters go through fp32 blocks in cache, converted with F16C/AVX-512 (the
  // element loop's own fp16 code does not vectorise); bf16 and fp32 are read and written in place.
  const bool f16_in = grad_dtype == DType::fp16, f16_out = param_out && param_dtype == DType::fp16;
  const AdamFns fns = pick_adam(f16_in ? DType::fp32 : grad_dtype, f16_out ? DType::fp32 : param_dtype, param_out != nullptr);
  const F16Converters& cv = f16_converters();
  const std::size_t gsz = dtype_size(grad_dtype), psz = dtype_size(param_dtype);
  const std::size_t nchunks = (n + kChunk - 1) / kChunk;
  // staging blocks of kChunk floats per thread: fp32 gradient and parameter (fp16 in or out), the
  // parameter copy as written (streamed out from there), the state (out of place)
  // The copy goes through the block and non-temporal stores only when the array spans a chunk or
  // more: below that the block, the stores and the fence cost more than the lines they save.
  const bool staged_out = param_out && n >= kChunk;
  const bool direct = into && adam_into_direct();
  // the state's blocks come last: 3 x kIntoBlock floats stepped directly, 3 x kChunk copied first
  const std::size_t nstage =
      ((f16_in || f16_out ? 2 : 0) + (staged_out ? 1 : 0)) * kChunk + (into ? 3 * (direct ? kIntoBlock : kChunk) : 0);
  const StreamBytes stream = streamer().fn;
  const bool dynamic = cpu_adam_dynamic_schedule();
  // the element sizes of what the element loop reads as the gradient and writes as the copy
  const std::size_t g_elem = f16_in ? sizeof(float) : gsz, out_elem = f16_out ? sizeof(float) : psz;
#pragma omp parallel if (nchunks > 1)
  {
    // per-thread staging blocks (heap, not TLS: this code may live in a dlopen'ed library)
    std::unique_ptr<float, decltype(&std::free)> stage(
        static_cast<float*>(nstage ? std::aligned_alloc(64, nstage * sizeof(float)) : nullptr), &std::free);
    if (nstage && !stage) std::abort();  // a few hundred KiB per thread: nothing to recover from
    float* gbuf = (f16_in || f16_out) ? stage.get() : nullptr;
    float* pbuf = gbuf ? gbuf + kChunk : nullptr;
    float* obuf = staged_out ? stage.get() + (gbuf ? 2 * kChunk : 0) : nullptr;  // the copy, param_dtype
    float* sbuf = into ? stage.get() + (gbuf ? 2 * kChunk : 0) + (obuf ? kChunk : 0) : nullptr;  // master, exp_avg, exp_avg_sq
    auto chunk = [&](std::size_t c) {
      const std::size_t off = c * kChunk;
      const std::size_t len = off + kChunk <= n ? kChunk : n - off;
      const void* g = static_cast<const char*>(grad) + off * gsz;
      if (f16_in) {
        cv.to_f32(static_cast<const std::uint16_t*>(g), gbuf, len);
        g = gbuf;
      }
      void* const dst = param_out ? static_cast<char*>(param_out) + off * psz : nullptr;
      void* out = f16_out ? static_cast<void*>(pbuf) : staged_out ? static_cast<void*>(obuf) : dst;
      if (direct) {  // stepped from the old state into the thread's blocks, each streamed out
        float *pb = sbuf, *mb = sbuf + kIntoBlock, *vb = sbuf + 2 * kIntoBlock;
        for (std::size_t b = 0; b < len; b += kIntoBlock) {
          const std::size_t bl = std::min(kIntoBlock, len - b);
          void* const out_b = out ? static_cast<char*>(out) + b * out_elem : nullptr;
          fns.into(master_in + off + b, exp_avg_in + off + b, exp_avg_sq_in + off + b, pb, mb, vb,
                   static_cast<const char*>(g) + b * g_elem, out_b, bl, sp);
          stream(master + off + b, pb, bl * sizeof(float));
          stream(exp_avg + off + b, mb, bl * sizeof(float));
          stream(exp_avg_sq + off + b, vb, bl * sizeof(float));
        }
      } else if (into) {  // the old state copied into the thread's blocks, stepped there, streamed out
        float *p = sbuf, *m = sbuf + kChunk, *v = sbuf + 2 * kChunk;
        std::memcpy(p, master_in + off, len * sizeof(float));
        std::memcpy(m, exp_avg_in + off, len * sizeof(float));
        std::memcpy(v, exp_avg_sq_in + off, len * sizeof(float));
        fns.in_place(p, m, v, g, out, len, sp);
        stream(master + off, p, len * sizeof(float));
        stream(exp_avg + off, m, len * sizeof(float));
        stream(exp_avg_sq + off, v, len * sizeof(float));
      } else {
        fns.in_place(master + off, exp_avg + off, exp_avg_sq + off, g, out, len, sp);
      }
      if (staged_out) {
        if (f16_out) cv.to_f16(pbuf, reinterpret_cast<std::uint16_t*>(obuf), len);
        stream(dst, obuf, len * psz);
      } else if (f16_out) {
        cv.to_f16(pbuf, static_cast<std::uint16_t*>(dst), len);
      }
    };
    // The same work items either way (each element's arithmetic does not depend on which thread
    // runs it). Handed out one at a time, a thread slowed down (its core shared with another of
    // the process's threads) holds up only the items it takes; with one contiguous range per
    // thread the whole team waits for the slowest (on the 20B quarter the CPU's Adam of one
    // subgroup took a median of 38-50 ms that way, against 30-36 ms dynamically).
    if (dynamic) {
#pragma omp for schedule(dynamic, 1)
      for (std::size_t c = 0; c < nchunks; ++c) chunk(c);
    } else {
#pragma omp for schedule(static)
      for (std::size_t c = 0; c < nchunks; ++c) chunk(c);
    }
    if (into || staged_out) _mm_sfence();  // the streamed stores are visible before the task ends
  }
}
}  // namespace

void adam_step_cpu(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
                   void* param_out, DType param_dtype, std::size_t n, const AdamStepParams& sp) {
  adam_step_any(false, master, exp_avg, exp_avg_sq, master, exp_avg, exp_avg_sq, grad, grad_dtype, param_out,
                param_dtype, n, sp);
}

void adam_step_into_cpu(const float* master_in, const float* exp_avg_in, const float* exp_avg_sq_in, float* master,
                        float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype, void* param_out,
                        DType param_dtype, std::size_t n, const AdamStepParams& sp) {
  adam_step_any(true, master_in, exp_avg_in, exp_avg_sq_in, master, exp_avg, exp_avg_sq, grad, grad_dtype, param_out,
                param_dtype, n, sp);
}

void copy_cpu(void* dst, const void* src, std::size_t bytes) {
  constexpr std::size_t kBytes = kChunk * sizeof(float);
  const std::size_t nchunks = (bytes + kBytes - 1) / kBytes;
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (std::size_t c = 0; c < nchunks; ++c) {
    const std::size_t off = c * kBytes;
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
                off + kBytes <= bytes ? kBytes : bytes - off);
  }
}

void zero_fill_cpu(float* p, std::size_t n) {
  const std::size_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (std::size_t c = 0; c < nchunks; ++c) {
    const std::size_t off = c * kChunk;
    std::memset(p + off, 0, (off + kChunk <= n ? kChunk : n - off) * sizeof(float));
  }
}

void convert_to_f32_cpu(const void* src, DType src_dtype, float* dst, std::size_t n) {
  auto fn = src_dtype == DType::bf16 ? convert_bf16 : convert_f32;
  const F16Converters& cv = f16_converters();
  const std::size_t ssz = dtype_size(src_dtype);
  const std::size_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (std::size_t c = 0; c < nchunks; ++c) {
    const std::size_t off = c * kChunk;
    const std::size_t len = off + kChunk <= n ? kChunk : n - off;
    if (src_dtype == DType::fp16) cv.to_f32(static_cast<const std::uint16_t*>(src) + off, dst + off, len);
    else fn(static_cast<const char*>(src) + off * ssz, dst + off, len);
  }
}

namespace {
#define DOS_STORE_VARIANT(NAME, D)                                                  \
  DOS_CLONES void NAME(const float* __restrict src, void* __restrict dst, std::size_t n) { \
    for (std::size_t i = 0; i < n; ++i) store_from_f32(dst, D, i, src[i]);         \
  }
DOS_STORE_VARIANT(store_bf16, DType::bf16)
DOS_STORE_VARIANT(store_f32, DType::fp32)
#undef DOS_STORE_VARIANT
}  // namespace

void convert_from_f32_cpu(const float* src, void* dst, DType dst_dtype, std::size_t n) {
  const F16Converters& cv = f16_converters();
  const std::size_t dsz = dtype_size(dst_dtype);
  const std::size_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (std::size_t c = 0; c < nchunks; ++c) {
    const std::size_t off = c * kChunk;
    const std::size_t len = off + kChunk <= n ? kChunk : n - off;
    void* d = static_cast<char*>(dst) + off * dsz;
    if (dst_dtype == DType::fp16) cv.to_f16(src + off, static_cast<std::uint16_t*>(d), len);
    else if (dst_dtype == DType::bf16) store_bf16(src + off, d, len);
    else store_f32(src + off, d, len);
  }
}

const char* f16_conversion_isa() { return f16_converters().isa; }

const char* cpu_param_copy_stores() { return streamer().name; }

void stream_copy_cpu(void* dst, const void* src, std::size_t bytes) { streamer().fn(dst, src, bytes); }

const char* adam_into_reads() { return adam_into_direct() ? "direct" : "copy"; }

const char* cpu_adam_schedule() { return cpu_adam_dynamic_schedule() ? "dynamic" : "static"; }

}  // namespace dos
