// The cost model: exact work of an op, its estimated time on two profiles, and a JSON override.
#include <cstdio>

#include "tandem/cost_model.h"

int main() {
  using namespace tandem;
  Graph g;
  // A decode-step projection: q4_0 weight [4096, 4096] times one token.
  TensorId w = g.weight("blk.0.attn_q.weight", DType::Q4_0, {4096, 4096});
  TensorId x = g.input("x", DType::F32, {4096, 1});
  TensorId y = g.matmul(w, x);
  OpWork work = op_work(g, g.node(y));
  // 2*K*M*N flops; bytes: 4096 rows * 128 blocks * 18 B + 16 KiB in + 16 KiB out.
  std::printf("flops %.0f (expect %.0f), bytes %.0f (expect %.0f)\n", work.flops, 2.0 * 4096 * 4096,
              work.bytes, 4096.0 * 128 * 18 + 16384 + 16384);

  CostModel model;
  model.load_json(R"({"profiles": {"gpu": {"memory_bandwidth_gbs": 3350,
                                          "link": {"bandwidth_gbs": 55, "latency_us": 8}}}})");
  BackendProfile cpu = model.profile("cpu", BackendKind::Cpu);
  BackendProfile gpu = model.profile("cuda:0", BackendKind::Gpu);
  OpCost on_cpu = CostModel::estimate(g, g.node(y), cpu);
  const uint8_t weight_not_resident[] = {1, 1};  // both inputs cross the link
  OpCost on_gpu = CostModel::estimate(g, g.node(y), gpu, weight_not_resident);
  std::printf("cpu: %.1f us compute\n", on_cpu.compute_us);
  std::printf("gpu: %.1f us compute + %.1f us transfer (weight not resident)\n", on_gpu.compute_us,
              on_gpu.transfer_us);
  const double want_bytes = 4096.0 * 128 * 18 + 32768;
  bool ok = work.flops == 2.0 * 4096 * 4096 && work.bytes == want_bytes &&
            on_gpu.compute_us < on_cpu.compute_us && on_gpu.transfer_us > on_gpu.compute_us;
  return ok ? 0 : 1;
}
