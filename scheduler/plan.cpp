// The plan registry (plan.h) and the helpers every plan and the runtime share.
#include "plan.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace dos {

// The plans of scheduler/meson.build's `plans` list, in its order (generated: plan_list.cpp).
const PlanEntry* const* built_in_plans(std::size_t* count);

namespace {

std::vector<PlanEntry>& registry() {
  static std::vector<PlanEntry> r = [] {
    std::size_t n = 0;
    const PlanEntry* const* list = built_in_plans(&n);
    std::vector<PlanEntry> v;
    for (std::size_t i = 0; i < n; ++i) v.push_back(*list[i]);
    return v;
  }();
  return r;
}

}  // namespace

void Plan::validate(const Workload&, const GpuBudgets&) const {}

bool PlanEntry::takes_argument() const { return usage && std::string(usage).find(':') != std::string::npos; }

const std::vector<PlanEntry>& plan_registry() { return registry(); }

void register_plan(const PlanEntry& entry) {
  if (!entry.name || !*entry.name) throw std::invalid_argument("register_plan: a plan needs a name");
  const std::string name = entry.name;
  if (name.find(':') != std::string::npos)
    throw std::invalid_argument("register_plan: plan name '" + name + "' contains ':' (write the argument in usage, "
                                "e.g. name \"static\", usage \"static:R\")");
  if (!entry.make) throw std::invalid_argument("register_plan: plan '" + name + "' has no factory (make is null)");
  for (const PlanEntry& e : registry())
    if (name == e.name) throw std::invalid_argument("register_plan: a plan named '" + name + "' is already registered");
  PlanEntry copy = entry;
  if (!copy.usage) copy.usage = copy.name;
  if (!copy.summary) copy.summary = "";
  registry().push_back(copy);
}

std::unique_ptr<Plan> make_plan_by_name(const std::string& text) {
  const std::size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  for (const PlanEntry& e : registry()) {
    if (name != e.name) continue;
    if (colon == std::string::npos && e.takes_argument())
      throw std::invalid_argument("plan '" + name + "' needs an argument: write it " + e.usage + " (" + e.summary + ")");
    if (colon != std::string::npos && !e.takes_argument())
      throw std::invalid_argument("plan '" + name + "' takes no argument: write it " + e.usage + ", not " + text);
    std::unique_ptr<Plan> p = e.make(colon == std::string::npos ? std::string() : text.substr(colon + 1));
    if (!p) throw std::invalid_argument("plan '" + name + "': its factory returned no plan");
    p->set_name(text);
    return p;
  }
  return nullptr;
}

std::string plan_usages() {
  std::string out;
  for (const PlanEntry& e : registry()) out += (out.empty() ? "" : ", ") + std::string(e.usage);
  return out;
}

std::string plan_contract_error(const Plan& plan, const Workload& w, const std::vector<PlanSide>& sides) {
  const std::size_t n = w.sizes.size();
  const std::string who = "plan " + plan.name();
  if (sides.size() != n)
    return who + " gave " + std::to_string(sides.size()) + " sides for " + std::to_string(n) + " subgroups";
  const bool budget = plan.needs().resident == ResidentState::budget;
  const std::size_t first_resident = n - std::min(w.resident, n);
  for (std::size_t i = 0; i < n; ++i) {
    if (sides[i] == PlanSide::gpu_streamed && !w.may_stream)
      return who + " streams subgroup " + std::to_string(i) +
             ", but the GPU update budget cannot hold a streamed subgroup (Workload::may_stream is false): it must "
             "stream nothing";
    if (sides[i] == PlanSide::gpu_resident && budget && i < first_resident)
      return who + " keeps subgroup " + std::to_string(i) + " resident on the GPU, but the resident budget holds " +
             (w.resident == 0 ? std::string("none") : "only the last " + std::to_string(std::min(w.resident, n))) +
             " (Workload::resident; a plan that picks its own resident subgroups declares ResidentState::own)";
  }
  return "";
}

std::string plan_letters(const std::vector<PlanSide>& plan) {
  std::string s(plan.size(), 'c');
  for (std::size_t i = 0; i < plan.size(); ++i)
    s[i] = plan[i] == PlanSide::gpu_streamed ? 's' : plan[i] == PlanSide::gpu_resident ? 'r' : 'c';
  return s;
}

std::string gb_text(double bytes) {
  char t[48];
  if (bytes >= 1e8 || bytes == 0)
    std::snprintf(t, sizeof t, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e5)
    std::snprintf(t, sizeof t, "%.2f MB", bytes / 1e6);
  else
    std::snprintf(t, sizeof t, "%.0f bytes", bytes);
  return t;
}

void apply_gpu_budgets(Workload& w, const Plan* plan, const GpuBudgets& budgets) {
  const std::size_t resident_bytes = budgets.resident > 0 ? std::size_t(budgets.resident) : 0;
  w.resident =
      plan && plan->needs().resident == ResidentState::budget ? resident_subgroups(w.sizes, resident_bytes, w.compact_master) : 0;
  w.may_stream = true;
  if (budgets.update > 0) {
    std::size_t need_cpu = 0, need_streamed = 0;
    for (std::size_t sz : w.sizes) {
      need_cpu = std::max(need_cpu, subgroup_footprint(w, sz, PlanSide::cpu));
      need_streamed = std::max(need_streamed, subgroup_footprint(w, sz, PlanSide::gpu_streamed));
    }
    if (budgets.update < need_cpu)
      throw std::invalid_argument("the GPU update budget of " + gb_text(double(budgets.update)) + " is below the " +
                                  gb_text(double(need_cpu)) +
                                  " one subgroup's gradient and parameter staging needs on the GPU: raise the budget "
                                  "or lower the subgroup size");
    w.may_stream = budgets.update >= need_streamed;
  }
  if (plan) plan->validate(w, budgets);
}

}  // namespace dos
