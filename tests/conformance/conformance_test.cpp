// Every registered backend other than the reference, every case it declares, compared with
// the reference; plus proof that it refuses what it does not declare.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "harness.h"
#include "reference_backend.h"
#include "tandem/registry.h"
#ifdef TANDEM_TEST_CUDA_BUILT
#include "cuda_backend.h"
#endif

namespace tandem::conformance {
namespace {

const std::vector<Case>& catalog() {
  static const std::vector<Case> cases = all_cases(true);
  return cases;
}

// Backends under test, created once per process. A backend that fails to construct is kept
// as its error so a test can report it instead of the whole binary failing to list.
struct BackendEntry {
  std::shared_ptr<Backend> backend;
  std::string error;
};

const std::map<std::string, BackendEntry>& backends_under_test() {
  static const std::map<std::string, BackendEntry> entries = [] {
    std::map<std::string, BackendEntry> out;
    for (const std::string& id : available_backend_ids()) {
      if (id == "reference") continue;
      try {
        out[id].backend = create_backend(id);
      } catch (const std::exception& e) {
        out[id].error = e.what();
      }
    }
    return out;
  }();
  return entries;
}

struct CaseParam {
  std::string backend_id;
  size_t case_index = 0;
};

// Readable in test listings (and in ctest names, which carry the parameter).
void PrintTo(const CaseParam& p, std::ostream* os) {
  *os << p.backend_id << " " << catalog()[p.case_index].name;
}

// Enumerated from each backend's registered rows: row by row, every case that dispatch sends
// to that row.
std::vector<CaseParam> declared_cases() {
  std::vector<CaseParam> params;
  for (const auto& [id, entry] : backends_under_test()) {
    if (!entry.backend) continue;
    std::vector<int> row_of(catalog().size());
    for (size_t i = 0; i < catalog().size(); ++i) {
      row_of[i] = dispatch_row(*entry.backend, catalog()[i]);
    }
    for (int r = 0; r < int(entry.backend->capabilities().size()); ++r) {
      for (size_t i = 0; i < catalog().size(); ++i) {
        if (row_of[i] == r) params.push_back({id, i});
      }
    }
  }
  return params;
}

std::vector<std::string> backend_ids() {
  std::vector<std::string> ids;
  for (const auto& [id, entry] : backends_under_test()) ids.push_back(id);
  return ids;
}

class BackendCase : public ::testing::TestWithParam<CaseParam> {};

TEST_P(BackendCase, MatchesReference) {
  const CaseParam& p = GetParam();
  Backend& backend = *backends_under_test().at(p.backend_id).backend;
  const CaseResult r = run_case(backend, catalog()[p.case_index], fresh_seed());
  EXPECT_TRUE(r.passed()) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Conformance, BackendCase, ::testing::ValuesIn(declared_cases()),
                         [](const ::testing::TestParamInfo<CaseParam>& param_info) {
                           return test_name(param_info.param.backend_id,
                                            catalog()[param_info.param.case_index].name);
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendCase);

class BackendTable : public ::testing::TestWithParam<std::string> {
 protected:
  Backend& backend() {
    const BackendEntry& e = backends_under_test().at(GetParam());
    if (!e.backend) throw std::runtime_error(e.error);
    return *e.backend;
  }
};

TEST_P(BackendTable, Constructs) {
  EXPECT_EQ(backends_under_test().at(GetParam()).error, "");
}

// Every combination the backend does not declare is refused, with the reason its table
// implies; every combination it declares passes check().
TEST_P(BackendTable, RefusesWhatItDoesNotDeclare) {
  Backend& b = backend();
  int refused = 0;
  for (const Case& c : catalog()) {
    const CapabilityCheck check = b.check(c.graph, c.node());
    const RejectReason expected = expected_reject_reason(b, c.graph, c.node());
    EXPECT_EQ(check.reason, expected)
        << c.name << ": check says '" << reject_reason_name(check.reason) << "' (" << check.detail
        << "), the table implies '" << reject_reason_name(expected) << "'";
    if (!check.ok()) {
      ++refused;
      EXPECT_FALSE(check.detail.empty()) << c.name << ": a refusal must say why";
    }
  }
  std::cout << b.backend_id() << " refuses " << refused << " of " << catalog().size()
            << " catalog cases\n";
}

// Every row of the table runs at least one case (the row dispatch picks for it), so no
// declared capability goes unchecked against the reference.
TEST_P(BackendTable, EveryDeclaredRowHasACase) {
  Backend& b = backend();
  std::vector<bool> covered(b.capabilities().size(), false);
  for (const Case& c : catalog()) {
    const int r = dispatch_row(b, c);
    if (r >= 0) {
      covered[size_t(r)] = true;
      EXPECT_TRUE(b.check(c.graph, c.node()).ok()) << c.name << ": dispatch and check disagree";
    }
  }
  for (size_t r = 0; r < covered.size(); ++r) {
    const OpCapability& row = b.capabilities()[r];
    std::string dtypes;
    for (DType d : row.dtypes) dtypes += std::string(dtype_name(d)) + " ";
    EXPECT_TRUE(covered[r]) << b.backend_id() << " declares " << op_name(row.op) << " [" << dtypes
                            << "] but no conformance case runs it: add one to cases.cpp";
  }
}

// Enough of the catalog runs on the backend: its count is printed, and a table or catalog change
// that drops it below the minimum fails.
TEST_P(BackendTable, RunsAtLeastTheMinimumCaseCount) {
  Backend& b = backend();
  size_t run = 0;
  for (const Case& c : catalog()) run += b.check(c.graph, c.node()).ok() ? 1 : 0;
  std::cout << b.backend_id() << ": " << run << " conformance cases run, " << catalog().size() - run
            << " refused\n";
  EXPECT_EQ(run, count_cases(b.capabilities(), b.features(), catalog()).run)
      << "check() and the capability table disagree";
  EXPECT_GE(run, kMinCasesPerBackend) << b.backend_id() << " runs too few conformance cases";
}

INSTANTIATE_TEST_SUITE_P(Conformance, BackendTable, ::testing::ValuesIn(backend_ids()),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return test_name(param_info.param, "table");
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendTable);

// Absent backends are reported as skips, never silently passed.
TEST(ConformanceAvailability, BackendsOtherThanReference) {
  if (backends_under_test().empty()) {
    GTEST_SKIP() << "no backend other than the reference is registered: conformance cases "
                    "skipped";
  }
  std::cout << declared_cases().size() << " conformance cases over " << backends_under_test().size()
            << " backend(s)\n";
  for (const auto& [id, entry] : backends_under_test()) {
    if (!entry.backend) continue;
    const CaseCount n =
        count_cases(entry.backend->capabilities(), entry.backend->features(), catalog());
    std::cout << "  " << id << ": " << n.run << " cases run, " << n.refused << " refused\n";
  }
}

TEST(ConformanceAvailability, CpuBackend) {
  if (!backends_under_test().count("cpu")) {
    GTEST_SKIP() << "cpu backend not built: CPU conformance cases skipped";
  }
}

TEST(ConformanceAvailability, CudaBackend) {
  bool any = false;
  for (const auto& [id, entry] : backends_under_test()) any |= id.starts_with("cuda:");
#ifdef TANDEM_TEST_CUDA_BUILT
  if (!any) GTEST_SKIP() << "no CUDA device: CUDA conformance cases skipped";
#else
  if (!any) GTEST_SKIP() << "CUDA backend not built: CUDA conformance cases skipped";
#endif
}

#ifdef TANDEM_TEST_CUDA_BUILT
// What the CUDA backend runs on the GPU machine (an sm_90 device), counted from its kernel table,
// so the count is checked where no GPU is present too.
TEST(Catalog, CudaTableRunsAtLeastTheMinimumCaseCount) {
  const std::vector<std::string> sm_90{"sm_90", "f16", "tensor_cores", "bf16", "cuda_graphs"};
  const CaseCount n = count_cases(CudaBackend::cuda_capabilities(), sm_90, catalog());
  std::cout << "cuda (sm_90, from its kernel table): " << n.run << " cases run, " << n.refused
            << " refused\n";
  EXPECT_GE(n.run, kMinCasesPerBackend);
}
#endif

// The catalog itself: unique names, every case valid for the reference, every reference row
// covered (so a backend that copies the reference table is fully exercised).
TEST(Catalog, NamesAreUniqueAndReferenceDeclaresEveryCase) {
  ReferenceBackend reference;
  std::set<std::string> names;
  for (const Case& c : catalog()) {
    EXPECT_TRUE(names.insert(test_name("x", c.name)).second) << "duplicate case " << c.name;
    EXPECT_TRUE(reference.check(c.graph, c.node()).ok()) << c.name;
    EXPECT_TRUE(is_compute(c.node().op)) << c.name;
  }
  EXPECT_GE(catalog().size(), kMinCasesPerBackend);
}

TEST(Catalog, CoversEveryReferenceRowAndEveryComputeOp) {
  ReferenceBackend reference;
  std::set<OpKind> ops;
  for (const Case& c : catalog()) ops.insert(c.node().op);
  for (int i = 0; i < kOpKindCount; ++i) {
    if (is_compute(OpKind(i))) {
      EXPECT_TRUE(ops.count(OpKind(i))) << op_name(OpKind(i));
    }
  }
  for (const OpCapability& row : reference.capabilities()) {
    bool covered = false;
    for (const Case& c : catalog()) {
      covered |= c.node().op == row.op && reference.op_capability(c.graph, c.node()) == &row;
    }
    EXPECT_TRUE(covered) << "reference row for " << op_name(row.op) << " has no case";
  }
}

}  // namespace
}  // namespace tandem::conformance
