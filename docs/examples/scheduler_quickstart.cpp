// Quickstart: schedule and run a small graph on every available backend, then print the
// placement and the telemetry. Built and run by ctest (docs/CMakeLists.txt).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <vector>

#include "tandem/executor.h"
#include "tandem/registry.h"
#include "tandem/scheduler.h"

int main() {
  using namespace tandem;
  // 1. Backends from the registry: cpu and cuda:N where built and present.
  std::vector<std::shared_ptr<Backend>> backends = available_backends();
  if (backends.empty()) backends.push_back(create_backend("reference"));
  HybridScheduler::Builder builder = HybridScheduler::builder();
  for (const auto& b : backends) builder.with_backend(b);
  HybridScheduler sched = builder.strategy(Strategy::gpu_preferred()).build();

  // 2. A graph: y = silu(W x), W f32 [64, 32] (ggml order: 64 inputs, 32 outputs), 4 tokens.
  Graph g;
  TensorId x = g.input("x", DType::F32, {64, 4});
  TensorId w = g.weight("w", DType::F32, {64, 32});
  TensorId y = g.silu(g.matmul(w, x));
  g.set_name(y, "y");
  g.mark_output(y);

  // 3. Data: weights are persistent host memory (e.g. an mmapped GGUF), inputs are per run.
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> xs(64 * 4), ws(64 * 32), ys(32 * 4);
  for (float& v : xs) v = u(rng);
  for (float& v : ws) v = u(rng);

  // 4. Plan (cached per graph signature and residency) and run.
  HybridExecutor exec(sched);
  exec.bind_weight("w", ws.data(), 4 * ws.size());
  std::shared_ptr<const Placement> placement = sched.plan(g, exec.residency());
  placement->print(std::cout, g);
  exec.run(g, *placement,
           Bindings().input("x", xs.data(), 4 * xs.size()).output("y", ys.data(), 4 * ys.size()));
  exec.telemetry().print_debug_summary(std::cout);

  // 5. Check against a plain loop: y[n][m] = silu(sum_k w[m][k] x[n][k]).
  double err = 0, norm = 0;
  for (int n = 0; n < 4; ++n)
    for (int m = 0; m < 32; ++m) {
      double acc = 0;
      for (int k = 0; k < 64; ++k) acc += double(ws[size_t(m * 64 + k)]) * xs[size_t(n * 64 + k)];
      double want = acc / (1.0 + std::exp(-acc));
      double got = ys[size_t(n * 32 + m)];
      err += (got - want) * (got - want);
      norm += want * want;
    }
  std::printf("nmse %.3g\n", err / norm);
  return err / norm < 5e-4 ? 0 : 1;
}
