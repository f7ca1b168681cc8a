// The extension path: an op defined in this test binary only (a descriptor, a reference kernel
// and a CPU kernel, nothing in the libraries) is built, declared, planned, costed, executed
// and compared with the reference like a built-in op.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu_backend.h"
#include "reference_backend.h"
#include "tandem/cost_model.h"
#include "tandem/error.h"
#include "tandem/executor.h"
#include "tandem/op.h"
#include "tandem/scheduler.h"

namespace tandem {
namespace {

// softsign(x) * scale = scale * x / (1 + |x|)
float softsign(float x, float scale) {
  return scale * x / (1.0f + std::fabs(x));
}

TensorDesc infer_softsign(OpInference& c) {
  c.expect_dtype(0, {DType::F32}, "x");
  return make_tensor_desc("", DType::F32, c.in(0).ne, c.in(0).n_dims);
}

void work_softsign(const Graph& g, const Node& n, OpWork& w) {
  w.flops = 4.0 * double(g.tensor(n.id).elements());  // abs, add, divide, scale
}

void reference_softsign(const NodeExecution& e) {
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  auto* o = static_cast<float*>(e.output.data);
  for (int64_t i = 0; i < e.output.desc->elements(); ++i)
    o[i] = softsign(x[i], e.node->params.scale);
}

void cpu_softsign(const cpu::OpContext& ctx, const NodeExecution& e) {
  const auto* x = static_cast<const float*>(e.inputs[0].data);
  auto* o = static_cast<float*>(e.output.data);
  const float scale = e.node->params.scale;
  ctx.pool.parallel_for(e.output.desc->elements(), 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) o[i] = softsign(x[i], scale);
  });
}

// Registered once per process, before any backend in this test is created.
OpKind softsign_op() {
  static const OpKind op = [] {
    const OpKind kind = register_op({.name = "test_softsign",
                                     .doc = "scale * x / (1 + |x|)",
                                     .min_inputs = 1,
                                     .max_inputs = 1,
                                     .attributes = kAttrScale,
                                     .infer = infer_softsign,
                                     .work = work_softsign});
    reference_kernels().add(kind, {DType::F32}, reference_softsign);
    cpu::kernel_table().add(kind, {DType::F32}, cpu_softsign);
    return kind;
  }();
  return op;
}

TEST(ExtensionOp, IsDescribedLikeABuiltInOp) {
  const OpKind op = softsign_op();
  EXPECT_GE(int(op), kOpKindCount);
  EXPECT_EQ(op_name(op), "test_softsign");
  EXPECT_EQ(op_from_name("test_softsign"), op);
  EXPECT_TRUE(is_compute(op));
  EXPECT_THROW(register_op({.name = "test_softsign", .infer = infer_softsign}), Error);

  Graph g;
  TensorId x = g.input("x", DType::F32, {37, 3});
  OpParams p;
  p.scale = 0.5f;
  TensorId y = g.add_node(op, {x}, p);
  EXPECT_EQ(g.tensor(y).ne, (Dims{37, 3, 1, 1}));
  EXPECT_EQ(op_work(g, g.node(y)).flops, 4.0 * 37 * 3);
  EXPECT_THROW(g.add_node(op, {x, x}), Error);  // arity from the descriptor
  TensorId ids = g.input("ids", DType::I32, {4});
  EXPECT_THROW(g.add_node(op, {ids}), Error);  // dtype rule from the descriptor

  // Both backends declare it, from the rows registered above.
  EXPECT_TRUE(ReferenceBackend().can_execute(g, g.node(y)));
  EXPECT_TRUE(cpu::CpuBackend(1).can_execute(g, g.node(y)));
}

TEST(ExtensionOp, RunsThroughTheSchedulerAndExecutor) {
  const OpKind op = softsign_op();
  auto cpu = std::make_shared<cpu::CpuBackend>(2);
  auto reference = std::make_shared<ReferenceBackend>();
  auto sched = HybridScheduler::builder()
                   .with_backend(cpu)
                   .with_backend(reference)
                   .strategy(Strategy::cpu_preferred())
                   .build();
  HybridExecutor exec(sched);

  Graph g;
  TensorId x = g.input("x", DType::F32, {1000, 7});
  OpParams p;
  p.scale = 1.5f;
  TensorId y = g.add_node(op, {x}, p);
  TensorId z = g.add(y, x);  // a built-in op reads the extension op's output
  g.mark_output(z);
  auto placement = sched.plan(g, exec.residency());
  EXPECT_EQ(placement->backends[size_t(placement->backend_index(y))]->backend_id(), "cpu");

  std::vector<float> in(7000), out(7000, NAN);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(int(i % 41) - 20) / 10.0f;
  exec.run(g, *placement,
           Bindings().input("x", in.data(), 4 * in.size()).output(z, out.data(), 4 * out.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_FLOAT_EQ(out[i], softsign(in[i], 1.5f) + in[i]) << i;
  }

  // Pinned to the reference, the same graph gives the same values through the other kernel.
  auto only_ref = HybridScheduler::builder()
                      .with_backend(cpu)
                      .with_backend(reference)
                      .strategy(Strategy::backend_only("reference"))
                      .build();
  HybridExecutor ref_exec(only_ref);
  std::vector<float> ref_out(7000, NAN);
  ref_exec.run(g, *only_ref.plan(g, ref_exec.residency()),
               Bindings()
                   .input("x", in.data(), 4 * in.size())
                   .output(z, ref_out.data(), 4 * ref_out.size()));
  EXPECT_EQ(out, ref_out);
}

}  // namespace
}  // namespace tandem
