// `tandem plan`: what a run with the same flags would place where, before any weight is read:
// tensors per layer and class, where prefill and decode ops run, bytes per device, the
// predicted tokens per second, and (auto) the candidates the search weighed.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands_impl.h"
#include "engine_flags.h"
#include "tandem/bytes.h"
#include "tandem/error.h"
#include "tandem/layer_split.h"
#include "tandem/runtime.h"

namespace tandem::cli {

namespace {

// The tensor classes a layer row shows.
const char* class_of(const std::string& name, bool cache) {
  if (cache) return "KV cache";
  if (name.find("_exps") != std::string::npos) return "experts";
  if (name.find("norm") != std::string::npos) return "norms";
  if (name.find("attn") != std::string::npos) return "attention";
  if (name.find("ffn") != std::string::npos) return "ffn";
  return "other";
}

const char* const kClasses[] = {"attention", "ffn", "experts", "norms", "KV cache"};

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : "+") + x;
  return out.empty() ? "-" : out;
}

// Consecutive layers with equal rows, as "a-b".
template <class Row>
std::vector<std::pair<std::string, Row>> ranges(const std::map<int, Row>& rows) {
  std::vector<std::pair<std::string, Row>> out;
  auto it = rows.begin();
  while (it != rows.end()) {
    auto jt = std::next(it);
    int last = it->first;
    while (jt != rows.end() && jt->first == last + 1 && jt->second == it->second)
      last = jt++->first;
    out.emplace_back(
        std::to_string(it->first) + (last > it->first ? "-" + std::to_string(last) : ""),
        it->second);
    it = jt;
  }
  return out;
}

std::string rate(double tokens, double us) {
  if (!(us > 0) || !std::isfinite(us)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", tokens * 1e6 / us);
  return buf;
}

}  // namespace

void add_plan(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand(
      "plan",
      "Show where a run would place weights, KV caches and ops, and the predicted speed, "
      "without loading any weight");
  struct Opts {
    EngineFlags engine;
    std::string strategy = "gpu";
    int64_t n_prompt = 512;
    bool json = false;
    bool ops = false;
  };
  auto o = std::make_shared<Opts>();
  o->engine.add(*cmd);
  cmd->add_option("--strategy", o->strategy, "gpu, cpu, auto or only:BACKEND (as run)")
      ->capture_default_str();
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens of the prefill step planned")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print the plan as JSON");
  cmd->add_flag("--ops", o->ops,
                "Also print every op of each phase: its backend, estimate and the reason");
  cmd->callback([&run, o]() {
    run = [o]() {
      SessionOptions eo = o->engine.to_options(o->strategy);
      print_gpu_flags_warning(o->engine);
      eo.record_events = false;
      Session engine(eo);
      const std::vector<PhasePlan> phases = engine.plan_phases(o->n_prompt);
      // Where each persistent tensor lives after both phases.
      Residency r;
      for (const PhasePlan& p : phases) r = residency_after(*p.graph, *p.placement, std::move(r));
      const Graph& g = *phases[0].graph;
      std::map<int, std::map<std::string, std::set<std::string>>> layer_rows;
      std::map<std::string, std::string> others;  // non-layer tensor -> home
      // MoE: per layer, the bytes of its expert tensors and where they live.
      std::map<int, std::pair<size_t, std::set<std::string>>> experts;
      std::map<std::string, size_t> weight_bytes, cache_bytes;
      size_t host_weight_bytes = 0;
      nlohmann::json tensors = nlohmann::json::array();
      for (const Node& n : g.nodes()) {
        if (n.op != OpKind::Weight && n.op != OpKind::KvCache) continue;
        const std::string& name = g.tensor(n.id).name;
        const size_t bytes = g.tensor(n.id).bytes();
        const bool cache = n.op == OpKind::KvCache;
        auto locs = r.locations(name);
        std::string home = locs.empty() ? "host" : locs.front();
        if (cache && locs.empty()) home = "host";
        if (!locs.empty()) (cache ? cache_bytes : weight_bytes)[home] += bytes;
        if (locs.empty() && !cache) host_weight_bytes += bytes;
        if (locs.empty() && cache) cache_bytes["host"] += bytes;
        tensors.push_back({{"name", name},
                           {"bytes", bytes},
                           {"home", home},
                           {"kind", cache ? "kv_cache" : "weight"}});
        const int layer = layer_of(name);
        if (layer >= 0) {
          layer_rows[layer][class_of(name, cache)].insert(home);
          if (std::string(class_of(name, cache)) == "experts") {
            experts[layer].first += bytes;
            experts[layer].second.insert(home);
          }
        } else {
          others[name] = home;
        }
      }
      // Where each phase runs each layer's ops.
      std::vector<std::map<int, std::string>> runs_on(phases.size());
      nlohmann::json jphases = nlohmann::json::array();
      for (size_t i = 0; i < phases.size(); ++i) {
        const PhasePlan& p = phases[i];
        std::map<int, std::set<std::string>> where;
        size_t streamed_ops = 0;
        for (const Node& n : p.graph->nodes()) {
          const BackendSelection& sel = p.placement->at(n.id);
          if (!is_compute(n.op) || !sel.backend) continue;
          std::string id = sel.backend->backend_id();
          if (!sel.streamed.empty()) {
            ++streamed_ops;
            id += " (streamed)";
          }
          for (TensorId in : n.inputs) {
            const TensorId s = p.graph->storage_of(in);
            if (p.graph->node(s).op != OpKind::Weight) continue;
            const int layer = layer_of(p.graph->tensor(s).name);
            if (layer >= 0) where[layer].insert(id);
          }
        }
        for (auto& [l, ids] : where) runs_on[i][l] = join(ids);
        nlohmann::json ops = nlohmann::json::object();
        const auto counts = p.placement->ops_per_backend();
        for (size_t b = 0; b < counts.size(); ++b) {
          if (counts[b]) ops[p.placement->backends[b]->backend_id()] = counts[b];
        }
        nlohmann::json layers = nlohmann::json::array();
        for (const auto& [range, ids] : ranges(runs_on[i])) {
          layers.push_back({{"layers", range}, {"runs_on", ids}});
        }
        jphases.push_back({{"name", p.name},
                           {"tokens", p.n_tokens},
                           {"predicted_us", p.predicted_us},
                           {"predicted_tokens_per_s", p.n_tokens * 1e6 / p.predicted_us},
                           {"ops", ops},
                           {"streamed_ops", streamed_ops},
                           {"streamed_bytes", p.placement->streamed_bytes},
                           {"transfers", p.placement->planned_transfers},
                           {"layers", layers}});
      }
      nlohmann::json jlayers = nlohmann::json::array();
      for (const auto& [range, row] : ranges(layer_rows)) {
        nlohmann::json j = {{"layers", range}};
        for (const char* c : kClasses) {
          auto it = row.find(c);
          j[c] = it == row.end() ? "-" : join(it->second);
        }
        jlayers.push_back(j);
      }
      nlohmann::json devices = nlohmann::json::object();
      for (const auto& b : engine.scheduler().backends()) {
        if (b->host_accessible()) continue;
        const std::string& id = b->backend_id();
        devices[id] = {{"budget_bytes", engine.scheduler().memory_budget(id)},
                       {"weight_bytes", weight_bytes[id]},
                       {"kv_cache_bytes", cache_bytes[id]}};
      }
      nlohmann::json out = {{"model", eo.model_path},
                            {"strategy", Strategy::parse(o->strategy).to_string()},
                            {"n_layer", engine.config().n_layer},
                            {"n_ctx", engine.n_ctx()},
                            {"devices", devices},
                            {"host_weight_bytes", host_weight_bytes},
                            {"host_kv_cache_bytes", cache_bytes["host"]},
                            {"layers", jlayers},
                            {"other_tensors", others},
                            {"phases", jphases}};
      const LlamaConfig& config = engine.config();
      std::map<int, std::pair<size_t, std::string>> expert_rows;
      for (const auto& [l, e] : experts) expert_rows[l] = {e.first, join(e.second)};
      if (config.is_moe()) {
        nlohmann::json jexperts = nlohmann::json::array();
        for (const auto& [range, row] : ranges(expert_rows)) {
          jexperts.push_back(
              {{"layers", range},
               {"bytes_per_layer", row.first},
               {"bytes_read_per_token",
                size_t(double(row.first) * double(config.n_expert_used) / double(config.n_expert))},
               {"home", row.second}});
        }
        out["experts"] = {{"n_expert", config.n_expert},
                          {"n_expert_used", config.n_expert_used},
                          {"layers", jexperts},
                          {"hot_experts", engine.hot_experts_enabled()}};
      }
      const ResidencyPlan* rp = engine.scheduler().residency_plan();
      if (rp) {
        nlohmann::json cands = nlohmann::json::array();
        for (size_t i = 0; i < rp->candidates.size(); ++i) {
          const auto& c = rp->candidates[i];
          nlohmann::json phase_us = nlohmann::json::array();
          for (double t : c.phase_us) phase_us.push_back(std::isfinite(t) ? t : -1.0);
          cands.push_back({{"name", c.name},
                           {"phase_us", phase_us},
                           {"score", c.score},
                           {"chosen", int(i) == rp->chosen}});
        }
        out["residency"] = {{"why", rp->why}, {"candidates", cands}};
      }
      if (o->json) {
        out["tensors"] = tensors;
        std::cout << out.dump(2) << "\n";
        return 0;
      }
      std::cout << "model " << eo.model_path << ": " << engine.config().n_layer
                << " layers, context " << engine.n_ctx() << "; strategy "
                << Strategy::parse(o->strategy).to_string() << "\n";
      for (const auto& [id, d] : devices.items()) {
        std::cout << id << ": budget " << format_bytes(d["budget_bytes"].get<size_t>())
                  << ", holds " << format_bytes(d["weight_bytes"].get<size_t>()) << " of weights, "
                  << format_bytes(d["kv_cache_bytes"].get<size_t>()) << " of KV cache\n";
      }
      std::cout << "host memory: " << format_bytes(host_weight_bytes)
                << " of weights read in place (mapped file), " << format_bytes(cache_bytes["host"])
                << " of KV cache\n";
      if (rp) std::cout << "residency (auto): " << rp->why << "\n";
      std::cout << "\nwhere tensors live\n";
      std::printf("  %-10s", "layers");
      for (const char* c : kClasses) {
        if (config.is_moe() || std::string(c) != "experts") std::printf(" %-14s", c);
      }
      std::printf("\n");
      for (const auto& j : jlayers) {
        std::printf("  %-10s", j["layers"].get<std::string>().c_str());
        for (const char* c : kClasses) {
          if (config.is_moe() || std::string(c) != "experts")
            std::printf(" %-14s", j[c].get<std::string>().c_str());
        }
        std::printf("\n");
      }
      for (const auto& [name, home] : others) std::cout << "  " << name << ": " << home << "\n";
      if (config.is_moe()) {
        // Why experts go to host memory: most of a layer's bytes, a small part read per token.
        std::cout << "\nexperts: " << config.n_expert << " per layer, " << config.n_expert_used
                  << " read per token (" << config.n_expert_used << " of " << config.n_expert
                  << " of each layer's expert bytes; a batch of T tokens reads at most "
                     "min(n_expert, "
                  << config.n_expert_used << " T))\n";
        for (const auto& [range, row] : ranges(expert_rows)) {
          std::cout << "  layers " << range << ": " << format_bytes(row.first)
                    << " of experts a layer, "
                    << format_bytes(size_t(double(row.first) * double(config.n_expert_used) /
                                           double(config.n_expert)))
                    << " read per token; on " << row.second << "\n";
        }
        if (engine.hot_experts_enabled()) {
          std::cout
              << "  hot experts (--hot-experts): chosen while running, not in this plan: after "
              << Session::kHotReviewSteps
              << " decode steps each layer whose experts stay in host memory gets its most "
                 "chosen ones (those that took "
              << int(100 * Session::kHotCoverage) << "% of its choices, at most "
              << config.n_expert / 4
              << ") as weights of their own, placed again with them; kept while decode "
                 "runs faster than with whole layers\n";
        }
      }
      for (size_t i = 0; i < phases.size(); ++i) {
        const auto& jp = jphases[i];
        std::cout << "\n"
                  << phases[i].name << " (" << phases[i].n_tokens << " token"
                  << (phases[i].n_tokens > 1 ? "s" : "") << "): predicted "
                  << rate(double(phases[i].n_tokens), phases[i].predicted_us) << " t/s ("
                  << long(std::lround(phases[i].predicted_us)) << " us a step)\n  ops:";
        for (const auto& [id, n] : jp["ops"].items()) std::cout << " " << id << " " << n;
        if (jp["streamed_ops"].get<size_t>() > 0) {
          std::cout << "; " << jp["streamed_ops"].get<size_t>() << " stream their weight ("
                    << format_bytes(jp["streamed_bytes"].get<size_t>()) << " a step)";
        }
        std::cout << "; " << jp["transfers"].get<size_t>() << " activation copies\n";
        for (const auto& l : jp["layers"]) {
          std::cout << "  layers " << l["layers"].get<std::string>() << ": "
                    << l["runs_on"].get<std::string>() << "\n";
        }
        if (o->ops) phases[i].placement->print(std::cout, *phases[i].graph);
      }
      if (rp) {
        std::cout << "\ncandidates auto weighed (predicted t/s: prefill, decode; * chosen)\n";
        for (size_t i = 0; i < rp->candidates.size(); ++i) {
          const auto& c = rp->candidates[i];
          std::printf("  %s %-52s %10s %8s  score %.3f\n", int(i) == rp->chosen ? "*" : " ",
                      c.name.c_str(), rate(double(o->n_prompt), c.phase_us[0]).c_str(),
                      c.phase_us.size() > 1 ? rate(1.0, c.phase_us[1]).c_str() : "-", c.score);
        }
      }
      return 0;
    };
  });
}

}  // namespace tandem::cli
