// The harness must be able to fail: a deliberately wrong backend is caught (wrong values,
// an out-of-bounds write, an unwritten output, a clobbered input), a correct backend under
// another name passes every case, and refusals follow the capability table.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness.h"
#include "reference_backend.h"
#include "tandem/op.h"

namespace tandem::conformance {
namespace {

// The reference under another name: what a correct backend looks like to the harness.
class CorrectBackend : public HostBackend {
 public:
  CorrectBackend() : HostBackend("reference-as-test") {}
  const std::vector<OpCapability>& capabilities() const override { return caps_; }
  void execute(const Graph& graph, const NodeExecution& exec) override {
    reference_execute(graph, exec);
  }

 private:
  std::vector<OpCapability> caps_ = ReferenceBackend::reference_capabilities();
};

// Right on every op except: softmax is 1% off, silu writes one element past its output,
// gelu never writes its output, scale also scribbles on its input.
class WrongBackend : public HostBackend {
 public:
  WrongBackend() : HostBackend("wrong-test") {}
  const std::vector<OpCapability>& capabilities() const override { return caps_; }
  void execute(const Graph& graph, const NodeExecution& exec) override {
    const OpKind op = exec.node->op;
    if (op == OpKind::Gelu) return;
    reference_execute(graph, exec);
    auto* out = static_cast<float*>(exec.output.data);
    const int64_t n = exec.output.desc->elements();
    if (op == OpKind::Softmax) {
      for (int64_t i = 0; i < n; ++i) out[i] *= 1.01f;
    } else if (op == OpKind::Silu) {
      out[n] = 0.0f;  // one past the end: lands in the harness's guard region
    } else if (op == OpKind::Scale) {
      static_cast<float*>(exec.inputs[0].data)[0] = 42.0f;
    }
  }

 private:
  std::vector<OpCapability> caps_ = ReferenceBackend::reference_capabilities();
};

// A table with holes: no gelu, no bf16 matmul, silu behind a missing feature, scale capped.
class PartialBackend : public HostBackend {
 public:
  PartialBackend() : HostBackend("partial-test") {
    for (OpCapability row : ReferenceBackend::reference_capabilities()) {
      if (row.op == OpKind::Gelu) continue;
      if (row.op == OpKind::MatMul && row.dtypes.front() == DType::BF16) continue;
      if (row.op == OpKind::Silu) row.required_feature = "no-such-feature";
      if (row.op == OpKind::Scale) row.max_elements = 200;
      caps_.push_back(row);
    }
  }
  const std::vector<OpCapability>& capabilities() const override { return caps_; }
  void execute(const Graph& graph, const NodeExecution& exec) override {
    reference_execute(graph, exec);
  }

 private:
  std::vector<OpCapability> caps_;
};

// An op from outside the library, registered as docs/adding-an-op.md shows: a descriptor, a
// reference row and a case generator, at static initialization, so the catalog and every
// backend of this binary see it from the start.
float square_keep_sign(float x) {
  return x * std::fabs(x);
}

TensorDesc infer_square_keep_sign(OpInference& c) {
  c.expect_dtype(0, {DType::F32}, "x");
  return make_tensor_desc("", DType::F32, c.in(0).ne, c.in(0).n_dims);
}

void reference_square_keep_sign(const NodeExecution& e) {
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  auto* o = static_cast<float*>(e.output.data);
  for (int64_t i = 0; i < e.output.desc->elements(); ++i) o[i] = square_keep_sign(x[i]);
}

void square_keep_sign_cases(std::vector<Case>& out, bool large);

const OpKind kSquareKeepSign = [] {
  const OpKind op = register_op({.name = "test_square_keep_sign",
                                 .doc = "x * |x|",
                                 .min_inputs = 1,
                                 .max_inputs = 1,
                                 .infer = infer_square_keep_sign});
  reference_kernels().add(op, {DType::F32}, reference_square_keep_sign);
  register_case_generator(op, square_keep_sign_cases);
  return op;
}();

void square_keep_sign_cases(std::vector<Case>& out, bool large) {
  std::vector<std::vector<int64_t>> shapes{{1}, {37, 3}, {33, 5, 2}};
  if (large) shapes.push_back({4096, 64});
  for (const std::vector<int64_t>& s : shapes) {
    Dims ne{1, 1, 1, 1};
    std::string name = "test_square_keep_sign/f32/";
    for (size_t i = 0; i < s.size(); ++i) {
      ne[i] = s[i];
      name += (i ? "x" : "") + std::to_string(s[i]);
    }
    Case c;
    c.name = name;
    const TensorId x =
        c.graph.leaf(OpKind::Input, make_tensor_desc("x", DType::F32, ne, int(s.size())));
    c.graph.add_node(kSquareKeepSign, {x});
    c.threshold = threshold_for(c.graph, c.node());
    out.push_back(std::move(c));
  }
}

// Runs the registered op through a row of its own, with the right kernel or a wrong one (the
// sign flipped: NMSE 4 whatever the inputs).
class SquareKeepSignBackend : public HostBackend {
 public:
  explicit SquareKeepSignBackend(bool right)
      : HostBackend(right ? "right-row-test" : "wrong-row-test"), right_(right) {}
  const std::vector<OpCapability>& capabilities() const override { return caps_; }
  void execute(const Graph&, const NodeExecution& exec) override {
    reference_square_keep_sign(exec);
    if (right_) return;
    auto* o = static_cast<float*>(exec.output.data);
    for (int64_t i = 0; i < exec.output.desc->elements(); ++i) o[i] = -o[i];
  }

 private:
  bool right_;
  std::vector<OpCapability> caps_{OpCapability{kSquareKeepSign, {DType::F32}}};
};

TEST(HarnessSelfTest, NmseBasics) {
  const std::vector<float> e{1.0f, 2.0f, -3.0f};
  EXPECT_EQ(nmse(e, e), 0.0);
  EXPECT_DOUBLE_EQ(nmse(e, std::vector<float>{1.0f, 2.0f, -2.0f}), 1.0 / 14.0);
  EXPECT_TRUE(std::isnan(nmse(e, std::vector<float>{1.0f, NAN, -3.0f})));
  EXPECT_EQ(nmse(std::vector<float>{0.0f}, std::vector<float>{0.0f}), 0.0);
  EXPECT_EQ(nmse(std::vector<float>{0.0f}, std::vector<float>{1.0f}), INFINITY);
  EXPECT_EQ(nmse(e, std::vector<float>{1.0f}), INFINITY);
}

TEST(HarnessSelfTest, ThresholdsFollowTheDesign) {
  for (const Case& c : all_cases(false)) {
    const OpKind op = c.node().op;
    double want = kExactThreshold;
    if (op == OpKind::MatMul || op == OpKind::QuantizedMatMul || op == OpKind::ExpertMatMul) {
      want = 5e-4;
    }
    if (op == OpKind::Attention) want = 5e-4;
    if (op == OpKind::Softmax || op == OpKind::MoeWeights) want = 1e-6;
    if (op == OpKind::Rope || op == OpKind::RopeNeox) want = 1e-3;
    if (op == OpKind::Copy && dtype_traits(c.graph.tensor(c.node().id).dtype).is_quantized) {
      want = kQuantizeThreshold;
    }
    EXPECT_EQ(c.threshold, want) << c.name;
  }
}

TEST(HarnessSelfTest, CatchesWrongValuesOutOfBoundsWritesNaNAndClobberedInputs) {
  WrongBackend wrong;
  const uint64_t seed = fresh_seed();
  int softmax = 0, silu = 0, gelu = 0, scale = 0, others = 0;
  for (const CaseResult& r : run_cases(wrong, all_cases(false), seed)) {
    SCOPED_TRACE(r.describe());
    ASSERT_TRUE(r.declared);
    EXPECT_TRUE(r.error.empty());
    if (r.case_name.starts_with("softmax/")) {
      ++softmax;
      EXPECT_FALSE(r.nmse_ok());
      EXPECT_GT(r.nmse, kSoftmaxThreshold);
      EXPECT_EQ(r.non_finite, 0);
      EXPECT_TRUE(r.guard_violations.empty());
      EXPECT_FALSE(r.passed());
    } else if (r.case_name.starts_with("silu/")) {
      ++silu;
      EXPECT_TRUE(r.nmse_ok()) << "silu's values are right; only its bounds are wrong";
      ASSERT_EQ(r.guard_violations.size(), 1u);
      EXPECT_NE(r.guard_violations[0].find("guard offset 0"), std::string::npos);
      EXPECT_NE(r.describe().find("out-of-bounds write"), std::string::npos);
      EXPECT_FALSE(r.passed());
    } else if (r.case_name.starts_with("gelu/")) {
      ++gelu;
      EXPECT_EQ(r.non_finite, r.compared) << "an unwritten output reads as NaN";
      EXPECT_FALSE(r.passed());
    } else if (r.case_name.starts_with("scale/")) {
      ++scale;
      EXPECT_TRUE(r.nmse_ok());
      ASSERT_EQ(r.modified_inputs.size(), 1u);
      EXPECT_FALSE(r.passed());
    } else {
      ++others;
      EXPECT_TRUE(r.passed());
    }
  }
  EXPECT_GT(softmax, 3);
  EXPECT_GT(silu, 2);
  EXPECT_GT(gelu, 2);
  EXPECT_GT(scale, 2);
  EXPECT_GT(others, 100);
}

TEST(HarnessSelfTest, CorrectBackendPassesEveryCase) {
  CorrectBackend correct;
  const uint64_t seed = fresh_seed();
  int ran = 0;
  for (const CaseResult& r : run_cases(correct, all_cases(true), seed)) {
    EXPECT_TRUE(r.passed()) << r.describe();
    EXPECT_GT(r.compared, 0) << r.describe();
    ++ran;
  }
  EXPECT_GT(ran, 200);
}

// The registered op's generator feeds the catalog like a built-in family's, its cases dispatch
// to the row that declares the op, and a row whose kernel is wrong fails every one of them.
TEST(HarnessSelfTest, RegisteredOpIsEnumeratedAndCheckedByRow) {
  const std::vector<Case> cases = cases_for(kSquareKeepSign, true);
  ASSERT_EQ(cases.size(), 4u);
  size_t in_catalog = 0;
  for (const Case& c : all_cases(true)) in_catalog += c.node().op == kSquareKeepSign;
  EXPECT_EQ(in_catalog, cases.size());

  SquareKeepSignBackend right(true), wrong(false);
  ReferenceBackend reference;
  const uint64_t seed = fresh_seed();
  for (const Case& c : cases) {
    EXPECT_GE(dispatch_row(reference, c), 0) << c.name;
    EXPECT_EQ(dispatch_row(right, c), 0) << c.name;
    const CaseResult good = run_case(right, c, seed);
    EXPECT_TRUE(good.passed()) << good.describe();
    EXPECT_GT(good.compared, 0) << good.describe();
    const CaseResult bad = run_case(wrong, c, seed);
    EXPECT_TRUE(bad.declared) << bad.describe();
    EXPECT_FALSE(bad.nmse_ok()) << bad.describe();
  }
}

TEST(HarnessSelfTest, RefusalsFollowTheTable) {
  PartialBackend partial;
  const uint64_t seed = fresh_seed();
  std::map<RejectReason, int> seen;
  for (const Case& c : all_cases(true)) {
    const CapabilityCheck check = partial.check(c.graph, c.node());
    EXPECT_EQ(check.reason, expected_reject_reason(partial, c.graph, c.node())) << c.name;
    const OpKind op = c.node().op;
    RejectReason want = RejectReason::None;
    if (op == OpKind::Gelu) want = RejectReason::UnsupportedOp;
    if (op == OpKind::Silu) want = RejectReason::MissingFeature;
    if (op == OpKind::MatMul && c.graph.tensor(c.node().inputs[0]).dtype == DType::BF16) {
      want = RejectReason::UnsupportedDType;
    }
    if (op == OpKind::Scale && node_max_elements(c.graph, c.node()) > 200) {
      want = RejectReason::TooLarge;
    }
    EXPECT_EQ(check.reason, want) << c.name << ": " << check.detail;
    seen[check.reason]++;
    if (!check.ok()) {
      EXPECT_FALSE(run_case(partial, c, seed).declared) << c.name;
    }
  }
  for (RejectReason r : {RejectReason::UnsupportedOp, RejectReason::UnsupportedDType,
                         RejectReason::MissingFeature, RejectReason::TooLarge}) {
    EXPECT_GT(seen[r], 0) << reject_reason_name(r);
  }
}

TEST(HarnessSelfTest, FillsAreValidAndFresh) {
  int checked = 0;
  for (const Case& c : all_cases(false)) {
    const auto a = make_inputs(c, 7), b = make_inputs(c, 8);
    for (const auto& [id, bytes] : a) {
      const TensorDesc& d = c.graph.tensor(id);
      ASSERT_EQ(bytes.size(), d.bytes()) << c.name;
      Fill fill = Fill::Random;
      int64_t limit = 0;
      for (const LeafFill& f : c.fills) {
        if (f.tensor == id) fill = f.fill, limit = f.limit;
      }
      if (d.dtype == DType::I8) continue;
      std::vector<float> v(static_cast<size_t>(d.elements()));
      to_f32(d.dtype, bytes.data(), v.data(), d.elements());
      for (size_t i = 0; i < v.size(); ++i) {
        if (fill == Fill::RowIds || fill == Fill::RandomPositions) {
          EXPECT_TRUE(v[i] >= 0 && v[i] < float(limit)) << c.name;
        } else if (fill == Fill::SequentialPositions) {
          EXPECT_EQ(v[i], v[0] + float(i)) << c.name;
          EXPECT_LE(v.back(), float(limit - 1)) << c.name;
        } else if (fill == Fill::CausalMask) {
          const int64_t n_kv = d.ne[0], n_q = d.ne[1], q = int64_t(i) / n_kv % n_q;
          const bool visible = int64_t(i) % n_kv <= q + (n_kv - n_q);
          EXPECT_EQ(visible, std::isfinite(v[i])) << c.name << " element " << i;
        } else if (d.dtype != DType::I32 && !dtype_traits(d.dtype).is_quantized) {
          EXPECT_TRUE(v[i] >= -1.0f && v[i] <= 1.0f && v[i] != 0.0f) << c.name << " " << v[i];
        }
      }
      // A different seed draws different floats (positions of a 1-token case may repeat).
      if (fill == Fill::Random && d.elements() > 4) {
        EXPECT_NE(bytes, b.at(id)) << c.name;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
}

}  // namespace
}  // namespace tandem::conformance
