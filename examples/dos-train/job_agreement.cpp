// The ranks' job check (job_agreement.h): rank 0's hashes broadcast, then one logical AND per
// option, so that every rank learns which options differ anywhere and all stop with one message;
// and dos-train's list of the options compared.
#include "job_agreement.h"

#include <cstdint>
#include <cstdio>
#include <stdexcept>

#include "checkpoint_format.h"
#include "checksum.h"
#include "dos.h"

namespace dos_train {

std::string job_disagreement(dos::Comm& comm, const std::vector<JobField>& fields) {
  constexpr std::size_t kMax = 64;
  if (fields.size() > kMax) throw std::invalid_argument("job_disagreement: at most 64 fields");
  std::uint64_t mine[kMax + 1] = {}, root[kMax + 1] = {};
  mine[kMax] = fields.size();  // the count itself, so that two builds' lists are not compared
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const std::string text = fields[i].option + '\0' + fields[i].value;
    mine[i] = dos::checksum(text.data(), text.size());
  }
  for (std::size_t i = 0; i <= kMax; ++i) root[i] = mine[i];
  comm.broadcast(root, sizeof root, 0);
  if (!comm.all_ok(root[kMax] == mine[kMax]))
    return "the ranks of this job run dos-train builds that check different options: start every rank with the "
           "same dos-train";
  std::string differ;
  for (std::size_t i = 0; i < fields.size(); ++i)
    if (!comm.all_ok(root[i] == mine[i])) differ += (differ.empty() ? "" : ", ") + fields[i].option;
  if (differ.empty()) return "";
  return "the ranks of this job were given different " + differ +
         ": every rank must run the same job (the same options; only the launcher's rank differs)";
}

std::vector<JobField> job_fields(const Args& a, const ModelConfig& cfg, const Checked& c, std::size_t subgroup,
                                 std::size_t parts) {
  auto place = [](const std::string& path) {  // two spellings of one folder are one place ("ck/" is "ck")
    return path.empty() ? std::string() : dos::checkpoint_io::without_trailing_slashes(resolved_path(path));
  };
  char norm[32];
  std::snprintf(norm, sizeof norm, "%a", a.max_grad_norm);
  return {{"--preset or --config (the model)", cfg.name + "\n" + describe_architecture(cfg)},
          {"--subgroup-size", std::to_string(subgroup)},
          {"--dtype", a.dtype},
          {"--seed", std::to_string(a.seed)},
          {"--grad-parts", std::to_string(parts)},
          {"--optimizer, --lr, --beta1, --beta2, --eps or --weight-decay",
           dos::moment_hyper_text(c.hyper) + "\n" + dos::step_hyper_text(c.hyper)},
          {"--iterations", std::to_string(a.iterations)},
          {"--max-grad-norm", norm},
          {"--nan-gradient-at", std::to_string(a.nan_gradient_at)},
          {"--resume", place(a.resume)},
          {"--save-state", place(a.save_state)},
          {"--plan-only", a.plan_only ? "yes" : "no"},
          {"--emulate-compute or --overlap",
           std::string(a.emulate_compute ? "emulate " : "") + (c.overlap ? "overlap" : "")},
          {"--comm", a.comm}};
}

}  // namespace dos_train
