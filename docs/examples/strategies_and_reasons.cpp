// Strategies and reasons: a "GPU" that cannot run RoPE and has a small memory budget, pins,
// Automatic with its per-candidate costs, and strict mode. Runs without a GPU: the device
// here is a host backend that declares itself a GPU (as the scheduler tests do).
#include <iostream>
#include <string>
#include <vector>

#include "reference_backend.h"
#include "tandem/error.h"
#include "tandem/scheduler.h"

namespace {
using namespace tandem;

// A device-like backend: kind Gpu, memory the executor must copy to, a restricted table.
class FakeGpu : public HostBackend {
 public:
  FakeGpu() : HostBackend("gpu") {
    for (const OpCapability& c : ReferenceBackend::reference_capabilities()) {
      if (c.op != OpKind::Rope) caps_.push_back(c);
    }
  }
  BackendKind kind() const override { return BackendKind::Gpu; }
  bool host_accessible() const override { return false; }
  const std::vector<OpCapability>& capabilities() const override { return caps_; }
  void execute(const Graph& g, const NodeExecution& e) override { reference_execute(g, e); }

 private:
  std::vector<OpCapability> caps_;
};

// Three layers: matmul with a 16 KiB weight, then RoPE.
struct Layers {
  Graph g;
  std::vector<TensorId> matmul, rope;
  Layers() {
    TensorId x = g.input("x", DType::F32, {64, 1});
    TensorId pos = g.input("pos", DType::I32, {1});
    for (int l = 0; l < 3; ++l) {
      TensorId w = g.weight("blk." + std::to_string(l) + ".w", DType::F32, {64, 64});
      matmul.push_back(g.matmul(w, x));
      rope.push_back(g.rope(g.reshape(matmul.back(), {16, 4, 1}), pos, 16, 10000.0f));
      x = g.reshape(rope.back(), {64, 1});
    }
    g.mark_output(x);
  }
};

bool expect(bool ok, const std::string& what) {
  if (!ok) std::cerr << "unexpected: " << what << "\n";
  return ok;
}
}  // namespace

int main() {
  auto cpu = std::make_shared<ReferenceBackend>();
  auto gpu = std::make_shared<FakeGpu>();
  Layers L;
  const Graph& g = L.g;
  const TensorId mm0 = L.matmul[0], rope0 = L.rope[0], mm2 = L.matmul[2];
  bool ok = true;

  // GpuPreferred with a budget for two layers' weights: layers 0-1 on the GPU, layer 2 on the
  // CPU (MemoryConstraint), RoPE always on the CPU (CpuFallback: the GPU does not run it).
  auto sched = HybridScheduler::builder()
                   .with_cpu_backend(cpu)
                   .with_gpu_backend(gpu)
                   .strategy(Strategy::gpu_preferred())
                   .memory_budget("gpu", 2 * 64 * 64 * 4 + 1024)
                   .build();
  auto p = sched.plan(g);
  p->print(std::cout, g);
  ok &= expect(p->at(mm0).reason.kind == SelectionReason::Kind::GpuAvailable, "gpu_available");
  ok &= expect(p->at(rope0).reason.kind == SelectionReason::Kind::CpuFallback, "cpu_fallback");
  ok &= expect(p->at(mm2).reason.kind == SelectionReason::Kind::MemoryConstraint, "memory");
  for (const RejectedCandidate& r : p->at(rope0).rejected) {
    std::cout << "rope0 rejected " << r.backend_id << ": " << reject_reason_name(r.reason) << " ("
              << r.detail << ")\n";
  }

  // A pin (llama.cpp's --override-tensor): layer 1's weights stay on the CPU.
  auto pinned = HybridScheduler::builder()
                    .with_backend(cpu)
                    .with_backend(gpu)
                    .pin_tensor("blk\\.1\\..*", "reference")
                    .build();
  const BackendSelection s = pinned.select_backend(g, L.matmul[1]);
  std::cout << "layer 1 matmul: " << s.backend->backend_id() << ", " << s.reason.to_string()
            << "\n";
  ok &= expect(s.reason.kind == SelectionReason::Kind::UserPreference, "user_preference");

  // Automatic: every candidate's cost is in the reason.
  auto automatic = HybridScheduler::builder()
                       .with_backend(cpu)
                       .with_backend(gpu)
                       .strategy(Strategy::automatic())
                       .build();
  std::cout << "automatic: " << automatic.plan(g)->at(mm0).reason.to_string() << "\n";

  // Strict: a fallback is an error that says what could not run where.
  auto strict = HybridScheduler::builder().with_backend(cpu).with_backend(gpu).strict().build();
  try {
    strict.plan(g);
    ok = false;
  } catch (const Error& e) {
    std::cout << "strict: " << e.what() << "\n";
  }
  return ok ? 0 : 1;
}
