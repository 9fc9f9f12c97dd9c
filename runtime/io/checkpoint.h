// Checkpoints of the optimizer state: a folder with index.json and one safetensors file per rank,
// written so that a crash mid-save leaves the previous checkpoint usable.
//
//   DIR/index.json                        format, model, parameter counts, ranks, subgroup size,
//                                         dtype, iterations done, seed, gradient parts, and
//                                         "ranks": [{rank, begin, end, file}] (each rank's flat
//                                         element range [begin, end) and its file)
//   DIR/rank-RRRRR-of-WWWWW.safetensors   master, exp_avg, exp_avg_sq (F32, this rank's flat
//                                         parameters), step (I64, one per subgroup),
//                                         subgroup_sizes (I64, elements; consecutive from begin),
//                                         master.xxh3, exp_avg.xxh3, exp_avg_sq.xxh3 (U64: the XXH3
//                                         64-bit checksum of every block of checksum_block_elements
//                                         elements of that tensor; checksum.h); metadata: format,
//                                         begin, end, checksum ("xxh3-64"), checksum_block_elements,
//                                         step.xxh3 and subgroup_sizes.xxh3 (whole-tensor checksums)
// A checkpoint resumes on any number of ranks (load_checkpoint re-shards it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "dos.h"

namespace dos {

/// What a checkpoint records besides the state. On resume, model, params_total, subgroup_size,
/// dtype, seed and grad_parts must equal the running job's; rank, world, begin and end may differ
/// (the state is re-sharded). model: a name (preset or config path); params_total: parameters of
/// the whole model; begin, end: this rank's flat element range [begin, end) of the model's
/// parameters; rank, world: data-parallel position; subgroup_size: elements; dtype: "fp32", "fp16"
/// or "bf16"; iteration: iterations done when saved; seed: the run's seed; grad_parts: how many
/// data-parallel parts the (emulated) gradients sum (dos-train's --grad-parts, or its number of MPI
/// ranks; 1 otherwise); architecture: the model's shape in words (dos-train: arch, layers, hidden,
/// intermediate, heads, kv_heads, vocabulary, positions, tied embeddings), compared on resume when
/// both sides have one ("" for none). Ranges enforced on save and on load: params_total and
/// subgroup_size in [1, 2^53], iteration in [0, 2^53], world in [1, 2^20], grad_parts in [1, 2048],
/// and every subgroup's step count in [0, iteration].
struct CheckpointInfo {
  std::string model;
  std::string architecture;
  std::size_t params_total = 0, begin = 0, end = 0, rank = 0, world = 1, subgroup_size = 0;
  std::string dtype;
  std::int64_t iteration = 0;
  std::uint64_t seed = 0;
  std::size_t grad_parts = 1;
  /// The optimizer and the hyper-parameters its moments depend on (moment_hyper_text); "" when not
  /// recorded (checkpoints saved before it was, or a caller that does not say). A resume must match.
  std::string optimizer;
  /// The hyper-parameters only the parameters' step depends on (step_hyper_text); "" when not
  /// recorded. A resume may change them (a learning rate lowered from there on).
  std::string step_hyper;
};

/// The text CheckpointInfo::optimizer records for `h`: "adamw" or "adam", then beta1 and beta2 (the
/// moments' decay and bias correction), and for Adam weight_decay (its L2 term enters the
/// gradient, so the moments), each as name=value with 17 significant digits (two texts are equal
/// exactly when those hyper-parameters are). Throws nothing but std::bad_alloc.
std::string moment_hyper_text(const AdamHyper& h);

/// The text CheckpointInfo::step_hyper records for `h`: lr, eps, and for AdamW weight_decay (its
/// decoupled decay acts on the parameters only), as moment_hyper_text writes them.
std::string step_hyper_text(const AdamHyper& h);

/// How the ranks of a data-parallel job take part in a save (comm.h provides them): all_ok is a
/// logical AND over the ranks (every rank calls it, so it is also a barrier); from_rank0 returns
/// rank 0's value of its argument on every rank.
struct CheckpointRanks {
  std::function<bool(bool)> all_ok;
  std::function<long long(long long)> from_rank0;
};

/// Throws Error, before any work, when a checkpoint cannot be written at `dir`: its parent folder is
/// missing or not writable; `dir` is a symbolic link (saving would replace the link: give its
/// target); `dir` exists and is not a folder; `dir` names ".", ".." or "/" (saving
/// replaces the whole folder); or `dir` is a folder that holds anything but a checkpoint of ours
/// (index.json of this format, rank-RRRRR-of-WWWWW.safetensors files and their temporary files):
/// a user's folder is never emptied. An empty folder is accepted.
void check_checkpoint_dir(const std::string& dir);

/// Writes `opt`'s whole state (master, exp_avg, exp_avg_sq, step counts) and `info` to `dir`:
/// everything goes to a new folder next to it, which replaces `dir` only once complete (the
/// previous checkpoint is renamed aside and removed after). Throws Error naming the path and the
/// system error on failure; the previous checkpoint is then left in place.
/// With info.world > 1 and `ranks` given, every rank calls this collectively: rank 0 makes
/// the new folder, every rank writes its own file into it, and once all have (ranks->all_ok) rank 0
/// writes index.json (every rank's range and file) and swaps the folder in. A failure on any rank
/// throws on every rank and leaves the previous checkpoint in place. Without `ranks` (a lone
/// `--shard R/W` run) only this rank's file and entry are written.
/// Refused (Error, the previous checkpoint left in place; with `ranks`, on every rank, with this
/// rank's reason or "another rank refused") before anything is written: `dir` fails
/// check_checkpoint_dir; a number of `info` or a step count is out of the ranges above; `info`
/// describes another optimizer (its range holds another count than opt.num_params(), its
/// subgroup_size is not the optimizer's, its dtype is not opt.dtype()'s name); the state holds a
/// NaN or an infinity, or a negative exp_avg_sq (a diverged run: the message names the tensor, the
/// element and the value). The new folder takes the group and mode of the folder it replaces, and
/// the save id of its temporary folder's name is recorded in the index and every rank file. It is
/// registered with TempPathGuard while it is written (a SIGINT or SIGTERM removes it); after a
/// successful swap, DIR.tmp-XXXXXX folders that earlier saves left when killed (holding only
/// checkpoint files and no index.json, older than this save) are removed and named on standard
/// error; one holding a complete checkpoint is kept and named.
void save_checkpoint(const std::string& dir, const Optimizer& opt, const CheckpointInfo& info,
                     const CheckpointRanks* ranks = nullptr);

/// Reads this rank's part of the checkpoint in `dir` into `opt` (Optimizer::load_state_in_place:
/// every file is checked first, then this rank's elements are read straight into the optimizer's
/// host buffers), after
/// checking that it belongs to the same job as `expect` (model, params_total, subgroup_size, dtype,
/// seed, grad_parts). The checkpoint may have been saved by another number of ranks: this rank's
/// elements [expect.begin, expect.end) (opt.num_params() of them) are taken from whichever old rank
/// files the index's "ranks" entries say cover them, one file at a time (Adam is elementwise, so
/// master, exp_avg and exp_avg_sq re-shard exactly); each of this rank's subgroups (consecutive from
/// expect.begin, opt.subgroup_size(i) elements) takes the step count of the old subgroups it
/// overlaps. With the same ranks as the save, each rank reads just its own file, unchanged.
/// Returns the checkpoint's info (world: the ranks that saved it; rank, begin, end: its index's
/// first entry's).
/// Throws Error ("cannot resume: ..."), changing nothing, when:
///  - the folder, index.json or an old rank file it needs is missing or malformed (the message
///    names the file, e.g. rank-00001-of-00002.safetensors), or a file's tensors do not hold the
///    element count of its index entry;
///  - the checkpoint is of another model, subgroup size, dtype, seed or --grad-parts (the message
///    names both sides);
///  - the index's entries do not cover this rank's whole range (a lone `--shard R/W` run's
///    checkpoint holds only its own range; the message names the uncovered elements);
///  - one of this rank's subgroups overlaps old subgroups with different step counts (the message
///    names both element ranges and step counts, and says to resume with the old number of ranks);
///  - a number in index.json is not a whole number in its range (the message quotes it as written),
///    a step count is outside [0, iteration], or the checksum of step or subgroup_sizes differs;
///  - the checkpoint is of another architecture (when both sides record one).
/// The state's data are checked while they are read, block by block: the block's checksum against
/// the one stored, and every element of master and exp_avg finite, of exp_avg_sq finite and >= 0.
/// Throws Error after changing the state when such a check or the read itself fails (the message
/// names the file, the tensor, the elements and the check; an I/O error; a file replaced between
/// the checks and the read): `opt` is then marked broken and refuses to step. A rank file saved
/// before checksums were recorded loads with a warning on standard error.
CheckpointInfo load_checkpoint(const std::string& dir, Optimizer& opt, const CheckpointInfo& expect);

/// The checks of load_checkpoint that need no optimizer, for a caller to make before it allocates
/// one: `dir`/index.json is read and `expect` must be able to resume from it (the same model,
/// parameters, subgroup size, dtype, seed, --grad-parts, architecture and optimizer). Returns the
/// checkpoint's CheckpointInfo. Throws Error ("cannot resume: ...", as load_checkpoint) when the
/// folder or index.json is missing or malformed, or the checkpoint differs from `expect`; reads
/// no rank file (load_checkpoint checks those).
CheckpointInfo check_resumable(const std::string& dir, const CheckpointInfo& expect);

}  // namespace dos
