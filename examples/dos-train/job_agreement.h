// The check that every rank of a data-parallel dos-train job was given the same job: the options
// that decide the model, the state, the results or which collectives a rank makes, compared by
// hash across the ranks before any other collective. Ranks given different jobs would otherwise
// corrupt memory (a broadcast of another dtype's size), wait for ever (another iteration count) or
// save a checkpoint whose ranks disagree (another seed or learning rate), silently.
#pragma once

#include <string>
#include <vector>

#include "comm.h"
#include "model_config.h"
#include "options.h"

namespace dos_train {

/// One option every rank must be given alike: the option as a user writes it ("--dtype") and its
/// value as text (any text; "" for an option not given).
struct JobField {
  std::string option;
  std::string value;
};

/// Collective over `comm`'s ranks, which pass the same options in the same order (at most 64):
/// returns "" when every rank has the same value of every field, else (on every rank alike) a
/// message naming the options whose values differ between ranks and what to do. Each field is
/// compared by a 64-bit hash of its option and value (XXH3). Throws std::invalid_argument for
/// more than 64 fields, and what `comm` throws.
std::string job_disagreement(dos::Comm& comm, const std::vector<JobField>& fields);

/// dos-train's fields, in the order every rank passes them to job_disagreement: the model `cfg`
/// (its name and architecture), `subgroup` (elements per subgroup), --dtype, --seed, `parts` (the
/// emulated gradient's parts, --grad-parts resolved), the optimizer's hyper-parameters (c.hyper),
/// --iterations, --max-grad-norm, --nan-gradient-at, the --resume and --save-state folders (two
/// spellings of one folder alike: resolved_path, trailing slashes dropped), --plan-only, the
/// emulated compute and --overlap resolved (c.overlap), and --comm. Throws nothing but
/// std::bad_alloc.
std::vector<JobField> job_fields(const Args& a, const ModelConfig& cfg, const Checked& c, std::size_t subgroup,
                                 std::size_t parts);

}  // namespace dos_train
