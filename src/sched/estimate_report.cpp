// Estimates against measurements: the median |error| of timed ops, per op type, and the types
// whose estimates stray past kEstimateStrayFactor.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tandem/calibration.h"

namespace tandem {

EstimateReport estimate_report(std::span<const ExecutionEvent> events) {
  EstimateReport report;
  std::vector<double> all;
  std::map<std::string, std::vector<double>> errors;
  std::map<std::string, EstimateError> types;
  for (const ExecutionEvent& e : events) {
    if (e.kind != EventKind::Op || !(e.actual_us > 0.0)) continue;
    const double err = std::abs(e.estimated_us - e.actual_us) / e.actual_us;
    const std::string type = std::string(op_name(e.op)) + " on " + e.backend;
    all.push_back(err);
    errors[type].push_back(err);
    EstimateError& t = types[type];
    t.op_type = type;
    ++t.count;
    t.estimated_us += e.estimated_us;
    t.actual_us += e.actual_us;
  }
  report.ops = all.size();
  if (all.empty()) return report;
  report.median_abs_error = median(std::move(all));
  for (auto& [type, t] : types) {
    t.median_abs_error = median(std::move(errors[type]));
    report.by_type.push_back(t);
  }
  return report;
}

void print_estimate_report(const EstimateReport& report, std::ostream& os) {
  if (report.ops == 0) return;
  char line[256];
  std::snprintf(line, sizeof line, "estimate vs actual: median |error| %.1f%% over %zu timed ops\n",
                100.0 * report.median_abs_error, report.ops);
  os << line;
  std::snprintf(line, sizeof line, "  %-30s %6s %12s %12s %8s %9s\n", "op type", "ops", "est_us",
                "actual_us", "act/est", "med|err|");
  os << line;
  std::string strays;
  for (const EstimateError& t : report.by_type) {
    const double ratio = t.estimated_us > 0 ? t.actual_us / t.estimated_us : 0.0;
    std::snprintf(line, sizeof line, "  %-30s %6zu %12.0f %12.0f %7.2fx %8.1f%%\n",
                  t.op_type.c_str(), t.count, t.estimated_us, t.actual_us, ratio,
                  100.0 * t.median_abs_error);
    os << line;
    if (ratio > kEstimateStrayFactor || ratio < 1.0 / kEstimateStrayFactor) {
      std::snprintf(line, sizeof line, "  %s: actual %.2fx the estimate\n", t.op_type.c_str(),
                    ratio);
      strays += line;
    }
  }
  if (!strays.empty()) {
    std::snprintf(line, sizeof line, "estimates off by more than %.1fx (either way):\n",
                  kEstimateStrayFactor);
    os << line << strays;
  }
}

}  // namespace tandem
