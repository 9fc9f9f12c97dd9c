// The copies of CPU-updated subgroups between the caller's GPU tensors and their pinned host
// staging buffers, made by the runtime itself: the new 16-bit parameters up (host to GPU), the
// gradients down (GPU to host, in the caller's dtype).
//
// Why not StarPU tasks: as CUDA tasks (gather_cl, scatter_cl) these copies wait in the CUDA
// worker's first-in first-out queue behind every streamed subgroup's Adam submitted before them,
// and their data then wait on StarPU's one transfer stream per direction behind the streamed state
// already requested there (the lookahead's prefetches up, the eager write-backs down): on the 20B
// quarter every CPU subgroup's parameter upload ran after the last streamed Adam, in a tail of
// about 85 ms with nothing else on the link, and the CPU waited 21-28 ms at a time for gradients.
// Here each copy is issued on a CUDA stream of the CopyStream's own as soon as StarPU hands over
// the staging buffer, beside the streaming. Which engine makes it, as
// dos::runtime_copies_by_copy_engine says (DOS_COPY_BY):
//   - the parameters up, by default by a kernel (pcie_copy_cuda, codelets/kernels/pcie_copy.h)
//     through the pinned staging buffer's mapped pointer: a cudaMemcpyAsync there would wait for
//     the copy engine behind StarPU's queue of streamed state (measured: 710 ms, and again 627 ms,
//     for the first 248 MB parameter upload of the 20B quarter's phase, until the streaming had
//     ended);
//   - the gradients down, by default by cudaMemcpyAsync: they are asked for when the phase is
//     submitted, before StarPU writes any streamed state back, so the copy engine takes them first;
//     made by the kernel they held back StarPU's upload of the first streamed state (the first
//     streamed Adam began at 100-110 ms instead of 41-68 ms) while the kernels wrote into host
//     memory. Those asked for after write-backs began may wait behind all of them (on an H100,
//     one waited 542 ms, the CPU idle); under DOS_COPY_BY=auto (not always: 6% slower on an H200
//     where none waited so), and under the default, adaptive, once a download starved while the
//     CPU idled (download_starved and kStarvedCpuBusy below), a job issued while the optimizer
//     counts streamed state on its way
//     home (Job::engine_busy) goes by the kernel; DOS_AUTO_WRITEBACKS=N (a measurement switch,
//     default 1) asks for at least N of them on their way home (2: only when one waits behind
//     another on the link, as the write-backs did on that H100 and mostly did not on the H200).
// DOS_DOWNLOAD_STREAM=starpu (a measurement switch; default own) issues the downloads that go by
// cudaMemcpyAsync on StarPU's own device-to-host stream of that GPU instead of the CopyStream's,
// so that they take their turn first in, first out with the state write-backs asked for before
// them, as the phase simulation takes them, instead of in the copy engine's own order between
// streams (where StarPU exports no such stream function, or runs no CUDA worker on the device, the
// CopyStream's, with a warning on stderr, once). Measured on an H100 where no download waited:
// 9-10% slower than the CopyStream's own stream.
// Staging that is not pinned (the runtime could not pin it) goes by cudaMemcpyAsync. Same bytes
// either way.
// DOS_COPY_BLOCKS=N (a measurement switch) sets the kernel's grid (default: one block
// per multiprocessor); the kernel shares the GPU's cores with whatever else runs there.
//
// Contract: one CopyStream per direction per optimizer, used only in builds with CUDA
// (DOS_HAVE_CUDA; in others the constructor throws std::logic_error). enqueue() may be called
// from any thread, StarPU's callback threads included, and never blocks on a copy; the jobs run in
// FIFO order on a thread of the CopyStream's own, which sets the CUDA device of each job's first
// GPU pointer. The thread takes the first job queued and, behind it, as many of the next ones as
// keep the batch within kBatchBytes: it issues all their copies on the CopyStream's stream (a
// download by the copy engine under DOS_DOWNLOAD_STREAM=starpu: on StarPU's), one event recorded
// after each job's on the stream its copies went on, then waits for the events in order (polling up to kPollUs
// microseconds, then a blocking-sync wait: the thread sleeps through a long copy, it does not spin
// on a core), so a run of small copies costs one wake-up, not one each, and a large copy goes alone
// (measured on the 20B quarter: its 248 MB gradient copies issued back to back made the update
// phase 3-7% slower beside the CPU's Adam). A job on another device than the previous one's waits
// until those have ended. Each job's `done`
// runs on that thread once its copies have ended or failed, exactly once, in FIFO order, also for
// jobs still queued when the CopyStream is destroyed (the destructor runs them all, then joins).
// DOS_COPY_BATCH=0 (a measurement switch) takes one job at a time and sleeps on its event at once.
// The CopyStream creates no StarPU task and touches no StarPU data; under DOS_DOWNLOAD_STREAM=starpu
// it reads StarPU's worker table and issues downloads on StarPU's device-to-host stream. A job's
// timeline span starts when it was issued or when the latest earlier job of its batch on the same
// stream ended (a job not issued went on no stream; within a batch, since its last change of
// device), whichever is later; every job of a batch has ended before the next batch is issued, so
// no two spans of one stream overlap. On StarPU's stream a span includes the wait behind StarPU's
// transfers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "../codelets/codelets.h"

struct CUstream_st;  // cudaStream_t and cudaEvent_t without CUDA's headers
struct CUevent_st;

namespace dos::detail {

class CopyStream {
 public:
  /// Which way a job copies. to_gpu: host + segs[s].offset elements -> segs[s].param (the new
  /// parameters); to_host: segs[s].grad -> host + segs[s].offset elements (the gradients).
  enum class Direction { to_gpu, to_host };

  /// What one job did. start_us, end_us: starpu_timing_now()'s clock (microseconds) when the
  /// thread began to issue the job (before its device pointer lookup and, for the first job on a
  /// device, the stream's creation), or when the latest earlier job of its batch that went on the
  /// same stream ended, if that is later (the stream runs them one after the other; a job not
  /// issued went on none), and when its wait for its copies returned; bytes: bytes copied; error:
  /// empty, or what failed (the CUDA call and its message: the destination then holds an unknown
  /// mix of old and new values); by_engine: its copies went by cudaMemcpyAsync (the GPU's copy
  /// engine, in its order between streams) rather than by the kernel (false also for a job not
  /// issued).
  struct Result {
    double start_us = 0, end_us = 0;
    std::size_t bytes = 0;
    std::string error;
    bool by_engine = false;
  };
  /// One subgroup's copy: segment s (s < nseg) moves segs[s].count elements of elem_bytes bytes
  /// each between the GPU pointer of its direction (segs[s].param or segs[s].grad) and `host` +
  /// segs[s].offset elements (a packed staging buffer in subgroup order, pinned for the copy to be
  /// asynchronous). segs, the GPU buffers and `host` must stay valid, and the source unchanged,
  /// until `done` has been called. `done` runs on the CopyStream's thread and must not throw (an
  /// exception there ends the process).
  struct Job {
    Direction dir = Direction::to_gpu;
    const Segment* segs = nullptr;
    std::size_t nseg = 0;
    std::size_t elem_bytes = 0;
    void* host = nullptr;
    /// to_host only: copy the caller's parameters (Segment::param) instead of its gradients.
    bool params_down = false;
    /// When not null and at least DOS_AUTO_WRITEBACKS (default 1) as the job is issued, its copies go
    /// by the kernel through the
    /// staging's mapped pointer even where runtime_copies_by_copy_engine says the copy engine (the
    /// engine's queue of that direction holds transfers the copy would wait behind: DOS_COPY_BY=auto,
    /// and adaptive once turned, count the streamed state write-backs on their way home there).
    /// Must outlive the job.
    const std::atomic<int>* engine_busy = nullptr;
    std::function<void(const Result&)> done;
  };

  /// Starts the thread (its CUDA stream is made on first use, on the first job's device). Throws
  /// std::logic_error in a build without CUDA, std::system_error when the thread cannot start.
  CopyStream();
  /// Finishes every job queued (their `done` run), then stops the thread. No enqueue() may start
  /// once the destructor has begun (a job queued then would never run its `done`).
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  /// Queues j behind the jobs queued before it. Never blocks on a copy; throws std::bad_alloc only.
  void enqueue(Job j);

 private:
  /// How long a wait polls its event before it sleeps on it (microseconds).
  static constexpr double kPollUs = 50;
  /// The most bytes one batch of jobs copies, unless its first job alone is larger (16 MiB: about
  /// 0.6 ms of PCIe, beside which one wake-up, tens of microseconds, is small).
  static constexpr std::size_t kBatchBytes = std::size_t(16) << 20;
  /// The bytes job copies (its segments' elements times elem_bytes).
  static std::size_t job_bytes(const Job& job);
  void run();
  /// The CUDA device of job's first GPU pointer, or -1 when it has none (nseg 0) or on an error,
  /// which goes into err (else err is emptied).
  static int job_device(const Job& job, std::string& err);
  /// Issues job's copies on `stream` (on the job's device, current) without waiting; adds their
  /// bytes to res.bytes and stops at the first failure, written into res.error. Returns the stream
  /// they went on: `stream`, or StarPU's device-to-host stream for a download by the copy engine
  /// under DOS_DOWNLOAD_STREAM=starpu (the caller records its event there).
  static CUstream_st* issue(const Job& job, Result& res, CUstream_st* stream);
  /// Waits for `ev` (polls it up to kPollUs, then blocks): empty, or what failed.
  static std::string wait_event(CUevent_st* ev);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool closing_ = false;
  std::thread thread_;
};

/// Whether a gradient download by the copy engine starved (the adaptive rule of DOS_COPY_BY,
/// dos::runtime_copy_by): it took `seconds` from its issue to its end (Result::start_us, end_us)
/// for `bytes`, more than 10 times `bytes` at `b_d2h` (bytes/s, the model's device-to-host PCIe
/// rate, Rates::B_d2h) and more than `floor_seconds` (download_starved_floor()). A download that
/// waits behind the state write-backs already on the link takes a few of them (the longest of a
/// 20B quarter's later phases, 248 MB, took 13.8 ms on an H200, 38-48 ms on H100s); one that waits
/// behind every write-back queued, the later ones included, as on some H100 machines, takes
/// hundreds (542 ms).
/// False when b_d2h is not positive or `seconds` is not a number. Throws nothing.
bool download_starved(double seconds, std::size_t bytes, double b_d2h, double floor_seconds) noexcept;

/// The CPU workers' busy fraction of a phase (busy seconds over workers x the phase's seconds) under
/// which a starved download in it turns DOS_COPY_BY's adaptive rule: a download that waited while
/// the CPU had other work cost nothing (0.9; the phases whose downloads starved on an H100 kept the
/// CPU busy 45-65%, those where none did 93-98%).
inline constexpr double kStarvedCpuBusy = 0.9;

/// download_starved's floor, seconds: DOS_STARVED_DOWNLOAD_MS / 1000 (a measurement switch, read
/// once: a whole number of milliseconds 0..600000; 0 counts every download by the copy engine that
/// took more than 10 times its bytes at B_d2h), else 0.1; any other value is ignored, with a warning
/// on stderr.
double download_starved_floor();

}  // namespace dos::detail
