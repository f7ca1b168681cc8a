// What a session reports as JSON (the C API and the Python module hand these on): where its
// ops run and what it holds per backend, and what its steps measured.
#include <nlohmann/json.hpp>

#include "tandem/runtime.h"

namespace tandem {

namespace {

nlohmann::json ops_by_backend(const Placement& placement) {
  nlohmann::json out = nlohmann::json::object();
  const auto ops = placement.ops_per_backend();
  for (size_t i = 0; i < ops.size(); ++i) out[placement.backends[i]->backend_id()] = ops[i];
  return out;
}

}  // namespace

std::string Session::placement_json() {
  // Before the first step the phases are planned (as the first step will plan them).
  const std::vector<PhasePlan> phases = plan_phases(std::min<int64_t>(kPlanPrefillTokens, n_ctx_));
  nlohmann::json jbackends = nlohmann::json::array();
  const std::vector<size_t> ops = last_placement_ ? last_placement_->ops_per_backend()
                                                  : phases.back().placement->ops_per_backend();
  const Placement& shown = last_placement_ ? *last_placement_ : *phases.back().placement;
  for (const auto& b : scheduler_->backends()) {
    const std::string& id = b->backend_id();
    size_t n_ops = 0;
    for (size_t i = 0; i < shown.backends.size(); ++i) {
      if (shown.backends[i]->backend_id() == id) n_ops = ops[i];
    }
    nlohmann::json j = {{"id", id},
                        {"kind", std::string(backend_kind_name(b->kind()))},
                        {"ops", n_ops},
                        {"resident_bytes", executor_->resident_bytes(id)}};
    if (!b->host_accessible()) j["budget_bytes"] = scheduler_->memory_budget(id);
    jbackends.push_back(std::move(j));
  }
  nlohmann::json jphases = nlohmann::json::array();
  for (const PhasePlan& p : phases) {
    jphases.push_back({{"name", p.name},
                       {"n_tokens", p.n_tokens},
                       {"predicted_us", p.predicted_us},
                       {"ops", ops_by_backend(*p.placement)}});
  }
  nlohmann::json out = {
      {"strategy", scheduler_->strategy().to_string()},
      {"summary", placement_summary()},
      {"last_step", last_placement_ ? ops_by_backend(*last_placement_) : nlohmann::json(nullptr)},
      {"backends", jbackends},
      {"phases", jphases}};
  return out.dump();
}

std::string Session::telemetry_json() const {
  nlohmann::json out = nlohmann::json::parse(executor_->telemetry().summary_json());
  out["tokens"] = {{"evaluated", tokens_evaluated_}, {"generated", tokens_generated_}};
  nlohmann::json recoveries = nlohmann::json::array();
  for (const Recovery& r : recoveries_) {
    recoveries.push_back({{"error", std::string(error_code_name(r.error))},
                          {"backend", r.backend},
                          {"step", r.step},
                          {"what", r.what},
                          {"action", r.action}});
  }
  out["recoveries"] = std::move(recoveries);
  return out.dump();
}

}  // namespace tandem
