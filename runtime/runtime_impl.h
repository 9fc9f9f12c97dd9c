// Internal to the runtime (not installed): the Runtime's private part, which the Optimizer reads (the
// policy chosen), and StarPU's lifetime as the Runtime and the Optimizers share it. Contract: StarPU
// runs once per process; it stops when the Runtime is destroyed or, when Optimizers outlive the
// Runtime, when the last of them is destroyed (runtime.cpp counts the Runtimes, Optimizer::Impl the
// Optimizers). Both are created and destroyed on the caller's thread.
#pragma once

#include "../scheduler/policy.h"
#include "dos.h"

namespace dos {

struct Runtime::Impl {
  PolicyChoice choice;
};

namespace detail {
// The live Optimizers, and whether ~Runtime left starpu_shutdown to the last of them (runtime.cpp).
extern int g_live_optimizers;
extern bool g_shutdown_deferred;
}  // namespace detail

}  // namespace dos
