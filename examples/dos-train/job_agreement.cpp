// The ranks' job check (job_agreement.h): rank 0's hashes broadcast, then one logical AND per
// option, so that every rank learns which options differ anywhere and all stop with one message.
#include "job_agreement.h"

#include <cstdint>
#include <stdexcept>

#include "checksum.h"

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

}  // namespace dos_train
