// The compute emulator's GEMM list, driver and CPU stand-in (compute_emulator.h).
#include "compute_emulator.h"

#include "dos.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace dos_train {

std::vector<std::vector<Gemm>> forward_gemms(const ModelConfig& c) {
  std::vector<std::vector<Gemm>> layers(std::size_t(c.layers) + 1);
  const bool gpt2 = c.arch == "gpt2";
  for (const ParamTensor& t : param_tensors(c)) {
    if (t.kind != TensorKind::weight || t.shape.size() != 2) continue;
    const std::string& n = t.name;
    if (n == "wte.weight" || n == "wpe.weight" || n == "model.embed_tokens.weight") continue;  // lookups
    // layer index from "h.L." or "model.layers.L."
    const std::string key = gpt2 ? "h." : "model.layers.";
    std::size_t layer = std::size_t(c.layers);  // the head
    if (n.rfind(key, 0) == 0) layer = std::size_t(std::stoll(n.substr(key.size())));
    // GPT-2's Conv1D weights are [in, out]; the others are [out, in] (torch.nn.Linear)
    const Gemm g = gpt2 ? Gemm{t.shape[0], t.shape[1]} : Gemm{t.shape[1], t.shape[0]};
    layers[layer].push_back(g);
  }
  if (c.tie_embeddings) layers.back().push_back(Gemm{c.hidden, c.vocab});  // the head reuses the embedding
  return layers;
}

namespace {
/// The constructor's checks and scaling: every dimension and the tokens divided by scale (at least
/// 1 each); returns the scaled tokens.
std::int64_t scale_shapes(std::vector<std::vector<Gemm>>& gemms, std::int64_t tokens, std::int64_t scale) {
  if (tokens < 1) throw std::invalid_argument("the tokens per iteration must be at least 1, got " + std::to_string(tokens));
  if (scale < 1) throw std::invalid_argument("the scale must be at least 1, got " + std::to_string(scale));
  for (auto& layer : gemms)
    for (Gemm& g : layer) {
      g.in = std::max<std::int64_t>(1, g.in / scale);
      g.out = std::max<std::int64_t>(1, g.out / scale);
    }
  return std::max<std::int64_t>(1, tokens / scale);
}

/// The elements of the four buffers every layer shares: the largest weight (twice: it and its
/// gradient), the largest output gradient and the largest input gradient, T tokens.
struct SharedSizes {
  std::size_t weights, dy, dx;
};
SharedSizes shared_sizes(const std::vector<std::vector<Gemm>>& gemms, std::size_t T) {
  std::int64_t max_w = 1, max_in = 1, max_out = 1;
  for (const auto& layer : gemms)
    for (const Gemm& g : layer) {
      max_w = std::max(max_w, g.in * g.out);
      max_in = std::max(max_in, g.in);
      max_out = std::max(max_out, g.out);
    }
  return {std::size_t(max_w), T * std::size_t(max_out), T * std::size_t(max_in)};
}

/// The elements of one group's saved activations: its largest input and every output, T tokens.
std::size_t activation_elements(const std::vector<Gemm>& layer, std::size_t T) {
  std::int64_t in_max = 1, outs = 0;
  for (const Gemm& g : layer) in_max = std::max(in_max, g.in), outs += g.out;
  return T * std::size_t(in_max + outs);
}
}  // namespace

std::size_t ComputeEmulator::peak_bytes(const std::vector<std::vector<Gemm>>& gemms, std::int64_t tokens,
                                        std::size_t elem_bytes, std::int64_t scale) {
  std::vector<std::vector<Gemm>> g = gemms;
  const std::size_t T = std::size_t(scale_shapes(g, tokens, scale));
  const SharedSizes s = shared_sizes(g, T);
  std::size_t elements = 2 * s.weights + s.dy + s.dx;
  for (const auto& layer : g) elements += activation_elements(layer, T);
  return elements * elem_bytes;
}

std::string gpu_memory_warning(const GpuNeed& need, std::size_t free_bytes, const std::string& budget_text,
                               std::size_t budget_bytes, std::int64_t tokens) {
  const std::size_t sum = need.starpu_limit + need.compute + need.model;
  if (sum + kGpuSpareBytes <= free_bytes) return "";
  const std::size_t missing = sum + kGpuSpareBytes - free_bytes;
  // the update budget that would leave the spare, rounded down to 0.1 GB so that the figure named
  // passes this check itself
  const double fits_gb = budget_bytes > missing ? std::floor(double(budget_bytes - missing) / 1e8) / 10 : 0.0;
  char lower[256];
  if (fits_gb > 0)
    std::snprintf(lower, sizeof lower, "lower --gpu-update-budget (to %.1f GB or less) or --tokens", fits_gb);
  else
    std::snprintf(lower, sizeof lower,
                  "lower --tokens (or --gpu-resident-budget, when given): lowering --gpu-update-budget alone does not "
                  "make room");
  char msg[1024];
  std::snprintf(msg, sizeof msg,
                "this run may run out of GPU memory: StarPU may keep up to %.1f GB for the optimizer under "
                "--gpu-update-budget %s, the emulated forward and backward (--emulate-compute, --tokens %lld) hold "
                "%.1f GB at their peak and the model's parameters and gradients %.1f GB: %.1f GB in all, and the GPU "
                "has %.1f GB free, of which %.1f GB should stay spare. If it does, %s",
                need.starpu_limit / 1e9, budget_text.c_str(), (long long)tokens, need.compute / 1e9, need.model / 1e9,
                sum / 1e9, free_bytes / 1e9, kGpuSpareBytes / 1e9, lower);
  return msg;
}

ComputeEmulator::ComputeEmulator(std::vector<std::vector<Gemm>> gemms, std::int64_t tokens,
                                 std::unique_ptr<ComputeBackend> backend, std::int64_t scale)
    : gemms_(std::move(gemms)), tokens_(tokens), be_(std::move(backend)) {
  tokens_ = scale_shapes(gemms_, tokens, scale);
  const std::size_t e = be_->elem_bytes(), T = std::size_t(tokens_);
  const SharedSizes s = shared_sizes(gemms_, T);
  try {
    weights_ = be_->alloc(s.weights * e);
    dweights_ = be_->alloc(s.weights * e);
    dy_ = be_->alloc(s.dy * e);
    dx_ = be_->alloc(s.dx * e);
  } catch (...) {  // the destructor does not run for a constructor that throws
    for (void* p : {weights_, dweights_, dy_, dx_})
      if (p) be_->free(p);
    throw;
  }
}

ComputeEmulator::~ComputeEmulator() {
  for (void* p : {weights_, dweights_, dy_, dx_})
    if (p) be_->free(p);
}

std::size_t backward_group(const ModelConfig& c, const std::string& n) {
  const std::string key = c.arch == "gpt2" ? "h." : "model.layers.";
  if (n.rfind(key, 0) == 0) return std::size_t(std::stoll(n.substr(key.size())));
  if (n == "wte.weight" || n == "wpe.weight" || n == "model.embed_tokens.weight") return std::size_t(c.layers) + 1;
  return std::size_t(c.layers);  // lm_head, ln_f, model.norm
}

ComputeTimes ComputeEmulator::run(const std::function<void(std::size_t group)>& after_group,
                                  const std::function<void(std::size_t group)>& before_group,
                                  const std::function<void()>& between) {
  ComputeTimes out;
  const std::size_t e = be_->elem_bytes(), T = std::size_t(tokens_);
  std::vector<void*> acts(gemms_.size(), nullptr);
  struct Free {  // activations still alive on an exception are freed
    ComputeBackend& be;
    std::vector<void*>& a;
    ~Free() {
      for (void*& p : a)
        if (p) be.free(p), p = nullptr;
    }
  } guard{*be_, acts};
  using clock = std::chrono::steady_clock;
  auto seconds_since = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };
  auto t0 = clock::now();
  for (std::size_t l = 0; l < gemms_.size(); ++l) {
    if (before_group) {
      const auto wait = clock::now();
      before_group(l);
      out.forward_wait += seconds_since(wait);
    }
    std::int64_t in_max = 1;
    for (const Gemm& g : gemms_[l]) in_max = std::max(in_max, g.in);
    acts[l] = be_->alloc(activation_elements(gemms_[l], T) * e);  // saved input + every output
    char* y = static_cast<char*>(acts[l]) + T * std::size_t(in_max) * e;
    for (const Gemm& g : gemms_[l]) {
      be_->forward(weights_, acts[l], y, tokens_, g.in, g.out);
      out.flops += 2.0 * double(T) * double(g.in) * double(g.out);
      y += T * std::size_t(g.out) * e;
    }
  }
  be_->sync();
  out.peak_bytes = be_->used_bytes();
  out.forward = seconds_since(t0);
  if (between) between();
  auto t1 = clock::now();
  for (std::size_t l = gemms_.size(); l-- > 0;) {
    be_->span_begin();
    const auto launch = clock::now();
    for (auto g = gemms_[l].rbegin(); g != gemms_[l].rend(); ++g) {
      be_->backward(weights_, acts[l], dy_, dx_, dweights_, tokens_, g->in, g->out);
      out.flops += 4.0 * double(T) * double(g->in) * double(g->out);
    }
    out.backward_launch += seconds_since(launch);
    out.backward_device += be_->span_end();  // the layer's activations are read until its GEMMs end
    be_->free(acts[l]);
    acts[l] = nullptr;
    if (after_group) {
      const auto release = clock::now();
      after_group(l);
      out.backward_release += seconds_since(release);
    }
  }
  be_->sync();
  auto t2 = clock::now();
  out.backward = std::chrono::duration<double>(t2 - t1).count();
  return out;
}

namespace {

class CpuBackend : public ComputeBackend {
 public:
  std::size_t elem_bytes() const override { return sizeof(float); }
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    dos::check_host_memory(bytes, "the compute emulator's CPU stand-in (" + std::to_string(bytes) + " bytes of activations)");
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
      throw std::runtime_error("compute emulator: cannot allocate " + std::to_string(bytes) + " bytes");
    float* f = static_cast<float*>(p);
    std::fill(f, f + bytes / sizeof(float), 1e-2f);
    used_ += bytes;
    sizes_.push_back({p, bytes});
    return p;
  }
  void free(void* p) override {
    for (auto it = sizes_.begin(); it != sizes_.end(); ++it)
      if (it->first == p) {
        used_ -= it->second;
        sizes_.erase(it);
        break;
      }
    std::free(p);
  }
  void forward(const void* W, const void* X, void* Y, std::int64_t T, std::int64_t in, std::int64_t out) override {
    const float *w = static_cast<const float*>(W), *x = static_cast<const float*>(X);
    float* y = static_cast<float*>(Y);
#pragma omp parallel for schedule(static)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t o = 0; o < out; ++o) {
        float s = 0;
        for (std::int64_t i = 0; i < in; ++i) s += x[t * in + i] * w[o * in + i];
        y[t * out + o] = s;
      }
  }
  void backward(const void* W, const void* X, const void* dY, void* dX, void* dW, std::int64_t T, std::int64_t in,
                std::int64_t out) override {
    const float *w = static_cast<const float*>(W), *x = static_cast<const float*>(X), *dy = static_cast<const float*>(dY);
    float *dx = static_cast<float*>(dX), *dw = static_cast<float*>(dW);
#pragma omp parallel for schedule(static)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t i = 0; i < in; ++i) {
        float s = 0;
        for (std::int64_t o = 0; o < out; ++o) s += dy[t * out + o] * w[o * in + i];
        dx[t * in + i] = s;
      }
#pragma omp parallel for schedule(static)
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t i = 0; i < in; ++i) {
        float s = 0;
        for (std::int64_t t = 0; t < T; ++t) s += dy[t * out + o] * x[t * in + i];
        dw[o * in + i] = s;
      }
  }
  void sync() override {}
  void span_begin() override { span_ = std::chrono::steady_clock::now(); }
  double span_end() override { return std::chrono::duration<double>(std::chrono::steady_clock::now() - span_).count(); }
  std::uint64_t used_bytes() const override { return used_; }

 private:
  std::uint64_t used_ = 0;
  std::vector<std::pair<void*, std::size_t>> sizes_;
  std::chrono::steady_clock::time_point span_;
};

}  // namespace

std::unique_ptr<ComputeBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

#if !defined(DOS_HAVE_CUDA)
std::unique_ptr<ComputeBackend> make_cuda_backend(dos::DType) {
  throw std::runtime_error("this build has no CUDA: the compute emulator runs only its CPU stand-in");
}
#endif

}  // namespace dos_train
