// The runtime's own copies between the caller's GPU buffers and host staging: which of them the
// runtime makes itself rather than by StarPU tasks, and how (the copy engine or a kernel), as the
// process's environment says. Read once per process; the plan's phase simulation follows the same
// choices (models/phase_sim.h, Execution). Part of the public C++ API: runtime/dos.h includes it.
#pragma once

namespace dos {

/// Whether, with the caller's parameters on a GPU, the runtime copies the new parameters of the
/// subgroups updated on the CPU to them itself, on a CUDA stream of its own, as soon as each
/// subgroup's Adam ends (true), or by a write-back task in the CUDA worker's queue (false). True
/// unless the environment says DOS_PARAM_UPLOAD=task (a measurement switch, read once); the plan's
/// phase simulation follows the same choice (Execution::own_param_upload). Same results either way.
bool runtime_uploads_params();

/// Whether, with the caller's gradients on a GPU, the runtime copies the gradients of the subgroups
/// updated on the CPU into their host staging itself, on a CUDA stream of its own, as soon as their
/// update is submitted (true), or by a gradient conversion task in the CUDA worker's queue and
/// StarPU's device-to-host transfer (false). Only where the staged gradient keeps the caller's dtype
/// (OptimizerOptions::native_grads, or fp32 parameters); a conversion to fp32 stays a task. True
/// unless the environment says DOS_GRAD_DOWNLOAD=task (a measurement switch, read once); the plan's
/// phase simulation follows the same choice (Execution::own_grad_download). Same results either way.
bool runtime_downloads_grads();

/// The values DOS_COPY_BY may take (runtime_copy_by); the first is the default.
inline constexpr const char* kCopyByValues[] = {"adaptive", "memcpy-down", "auto", "kernel", "memcpy", "memcpy-up"};

/// How the runtime's own copies (runtime_uploads_params, runtime_downloads_grads) go, as the
/// environment's DOS_COPY_BY says (read once): "adaptive" (the default: unset, or a value not in
/// kCopyByValues, with a warning on stderr) as "memcpy-down" until a phase's gradient download by
/// the copy engine starves (detail::download_starved: more than 100 ms and 10 times its bytes at
/// the model's B_d2h) while the CPU workers idle more than 10% of the phase (detail::
/// kStarvedCpuBusy), in a phase run after backward (not overlapped, not left running into the next
/// forward, not skipped) other than the optimizer's first phase that streams, then as "auto" for
/// the rest of the process, every optimizer of it, in every phase but those overlapped with
/// backward (begin_step: there a download by the kernel waits behind backward's kernels, and the
/// CPU's speculative updates with it) (runtime_downloads_dodge_writebacks;
/// StepStats::downloads_dodge_writebacks says which a phase ran; with a verbose optimizer, a line
/// on stderr says when and why it turned); "memcpy-down" the gradient downloads by cudaMemcpyAsync
/// (the GPU's copy engine) and the parameter uploads by a kernel through the pinned staging's
/// mapped pointer;
/// "auto" as "memcpy-down", except that a gradient download issued while a streamed subgroup's
/// state is on its way home (its Adam ended on the GPU, its eager write-back not yet done) goes by
/// the kernel: by the copy engine it may wait behind every state write-back StarPU queued there,
/// the later ones included (on an H100: a 248 MB download issued at 71 ms ended at 613 ms, after 13
/// write-backs of 1.5 GB, the CPU idle meanwhile); on an H200 where no download waited so, "auto"
/// made the 20B quarter's phase 6% slower (0.7746 s against 0.7274 s, one run each), and on H100s
/// where none waited 0-6%, so it is taken only where a download starved;
/// "kernel" both directions by the kernel; "memcpy" both by cudaMemcpyAsync; "memcpy-up" the
/// uploads by cudaMemcpyAsync and the downloads by the kernel. The last five are measurement
/// switches. Why the downloads by the copy engine first (measured on the GPU machine, 20B quarter,
/// 19 CPU subgroups of 248 MB of gradients each, downloaded at the phase's start): downloads by the
/// kernel ran back to back for
/// about 110 ms and held back the streamed state's upload, so the first streamed Adam began at
/// 100-110 ms; by the copy engine at 41-68 ms. An upload by cudaMemcpyAsync waits behind every
/// streamed state StarPU has queued up (the first 248 MB one ended only at 672 ms, after the last
/// streamed Adam). Same results every way.
const char* runtime_copy_by();

/// Whether the runtime's own copies of one direction (up: the CPU-updated parameters to the GPU;
/// otherwise the gradients to host staging) go by cudaMemcpyAsync (the copy engine, shared in order
/// with StarPU's transfers of the same direction) rather than by a kernel, as runtime_copy_by()
/// says ("auto" and "adaptive": the copy engine, each download's own choice aside,
/// runtime_downloads_dodge_writebacks). The
/// plan's phase simulation follows it (Execution::grad_download_by_copy_engine,
/// param_upload_by_copy_engine; under "auto" it takes every download by the copy engine). Staging
/// the runtime could not pin goes by cudaMemcpyAsync whatever this says.
bool runtime_copies_by_copy_engine(bool up);

/// copies_by_copy_engine of the rule `copy_by` (one of kCopyByValues): what
/// runtime_copies_by_copy_engine says for a process whose DOS_COPY_BY is that rule ("memcpy",
/// "memcpy-up" up, "memcpy-down", "auto" and "adaptive" down: the copy engine; the rest a kernel),
/// for a rule read elsewhere (a dos-train report's "copy_by"). Throws nothing.
bool copies_by_copy_engine(const char* copy_by, bool up);

/// Whether runtime_copy_by() is "auto": each gradient download then goes by the kernel while a
/// streamed state write-back is on the device-to-host link, else by the copy engine.
bool runtime_copy_by_auto();

/// Whether the gradient downloads issued now go by the kernel while a streamed state write-back is
/// on the device-to-host link (else by the copy engine): always under DOS_COPY_BY=auto; under
/// "adaptive" (the default) once a download of this process starved (runtime_copy_by); never
/// otherwise. Same bits either way.
bool runtime_downloads_dodge_writebacks();

}  // namespace dos
