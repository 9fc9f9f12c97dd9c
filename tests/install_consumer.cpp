// A program built against an installed Deep Optimizer States with only
// `pkg-config --cflags --libs dos` (tests/e2e_install.sh): it includes the installed dos.h,
// runs one AdamW step on host fp32 parameters under the `cpu` policy and checks every new
// parameter against the step computed here by hand. Exits 0 when all agree, 1 otherwise.
#include <dos.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

int main() {
  try {
    // two tensors (5 and 3 elements) in subgroups of 4: two subgroups, the second across both tensors
    std::vector<float> w = {0.5f, -1.25f, 2.0f, 0.0f, 3.5f}, gw = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f};
    std::vector<float> b = {1.0f, -0.75f, 0.25f}, gb = {-1.5f, 0.0f, 2.5f};
    const std::vector<float> w0 = w, b0 = b;

    dos::RuntimeOptions ro;
    ro.policy = "cpu";
    ro.ncuda = 0;
    ro.cpu_threads = 1;
    ro.verbose = false;
    dos::Runtime rt(ro);

    dos::OptimizerOptions oo;
    oo.adam.lr = 0.01;
    oo.adam.weight_decay = 0.1;
    oo.adam.decoupled = true;
    oo.subgroup_size = 4;
    oo.dtype = dos::DType::fp32;
    oo.memory = dos::MemoryKind::host;
    oo.verbose = false;
    dos::Optimizer opt(rt, {{w.data(), gw.data(), w.size()}, {b.data(), gb.data(), b.size()}}, oo);
    const dos::StepStats s = opt.step();

    // AdamW's first step from zero moments: m = (1 - beta1) g and v = (1 - beta2) g^2, whose
    // bias corrections give back g and g^2, so p <- p (1 - lr wd) - lr g / (|g| + eps).
    int bad = 0;
    auto check = [&](const char* name, const std::vector<float>& p0, const std::vector<float>& g,
                     const std::vector<float>& p) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double want = p0[i] * (1.0 - oo.adam.lr * oo.adam.weight_decay) -
                            oo.adam.lr * g[i] / (std::fabs(g[i]) + oo.adam.eps);
        if (std::fabs(p[i] - want) > 1e-6 * (1.0 + std::fabs(want))) {
          std::fprintf(stderr, "%s[%zu] = %.9g after one AdamW step, expected %.9g\n", name, i, p[i], want);
          ++bad;
        }
      }
    };
    check("w", w0, gw, w);
    check("b", b0, gb, b);
    if (s.params != 8 || s.step != 1 || opt.num_subgroups() != 2) {
      std::fprintf(stderr, "step stats: params %zu (expected 8), step %lld (expected 1), subgroups %zu (expected 2)\n",
                   s.params, static_cast<long long>(s.step), opt.num_subgroups());
      ++bad;
    }
    if (bad) return 1;
    std::printf("install consumer: one AdamW step on %zu parameters under policy %s matches the hand-computed step\n",
                s.params, rt.policy().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "install consumer: %s\n", e.what());
    return 1;
  }
}
