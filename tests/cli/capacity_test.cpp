// A model that cannot fit (weights plus the KV caches of the asked context, against the budgets
// of the GPUs the strategy may use plus the host's available memory) is refused before it is
// loaded, with every number; one that fits is not.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "capacity.h"
#include "cli_harness.h"
#include "tandem/error.h"
#include "test_backends.h"

namespace tandem::cli {
namespace {

constexpr double kGiB = double(uint64_t(1) << 30);

std::string refusal(const Capacity& c) {
  try {
    check_capacity(c);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::OutOfMemory);
    return e.what();
  }
  return "";
}

TEST(Capacity, RefusalGivesEveryNumber) {
  Capacity c;
  c.weights_bytes = 3 * kGiB;
  c.kv_bytes = 2 * kGiB;
  c.n_ctx = 8192;
  c.kv_dtype = DType::F16;
  c.gpu_bytes = 1 * kGiB;
  c.gpus = 1;
  c.host_bytes = 3.5 * kGiB;
  const std::string why = refusal(c);
  for (std::string part :
       {"[capacity] the model does not fit", "weights 3.00 GiB", "KV cache 2.00 GiB",
        "(8192 positions, f16)", "= 5.00 GiB", "GPU budgets 1.00 GiB (1 GPU)",
        "host memory available 3.50 GiB", "--ctx-size", "--gpu-mem"}) {
    EXPECT_NE(why.find(part), std::string::npos) << part << " in: " << why;
  }
  c.host_bytes = 4 * kGiB;  // exactly enough
  EXPECT_TRUE(c.fits());
  EXPECT_EQ(refusal(c), "");

  Capacity cpu_only = c;
  cpu_only.gpu_bytes = 0;
  cpu_only.gpus = 0;
  const std::string no_gpu = refusal(cpu_only);
  EXPECT_EQ(no_gpu.find("GPU"), std::string::npos) << "no GPU to speak of: " << no_gpu;
  EXPECT_EQ(no_gpu.find("--gpu-mem"), std::string::npos) << no_gpu;
}

TEST(Capacity, KvCacheIsKeyAndValueOfEveryLayerForEveryPosition) {
  LlamaConfig config;
  config.n_layer = 3;
  config.n_head_kv = 4;
  config.head_dim = 64;
  // 2 (K and V) x 3 layers x 100 positions x 4 heads x 64 x 2 bytes.
  EXPECT_EQ(kv_cache_bytes(config, 100, DType::F16), 2.0 * 3 * 100 * 4 * 64 * 2);
  EXPECT_EQ(kv_cache_bytes(config, 100, DType::F32), 2.0 * 3 * 100 * 4 * 64 * 4);
  // A trillion positions is a number to refuse, not an overflow.
  EXPECT_EQ(kv_cache_bytes(config, 1'000'000'000'000, DType::F16), 2.0 * 3 * 1e12 * 4 * 64 * 2);
}

TEST(Capacity, CountsTheBudgetsOfTheGpusTheStrategyMayUse) {
  std::vector<std::shared_ptr<Backend>> backends{test::make_cpu(), test::make_gpu("gpu0"),
                                                 test::make_gpu("gpu1")};
  const double gpu1_free = double(backends[2]->memory().free_bytes);
  GpuSetup setup;
  setup.budgets = {{"gpu0", uint64_t(2) << 30}};  // --gpu-mem gpu0=2G; gpu1 has no budget
  auto gpu_bytes = [&](const std::string& strategy) {
    Capacity c;
    add_gpu_budgets(c, backends, setup, Strategy::parse(strategy));
    return std::make_pair(c.gpu_bytes, c.gpus);
  };
  EXPECT_EQ(gpu_bytes("gpu"), std::make_pair(2 * kGiB + gpu1_free, 2));
  EXPECT_EQ(gpu_bytes("auto"), std::make_pair(2 * kGiB + gpu1_free, 2));
  EXPECT_EQ(gpu_bytes("cpu"), std::make_pair(0.0, 0)) << "cpu keeps the weights on the host";
  EXPECT_EQ(gpu_bytes("only:gpu0"), std::make_pair(2 * kGiB, 1));
  EXPECT_EQ(gpu_bytes("only:cpu"), std::make_pair(0.0, 0));
}

TEST(Capacity, HostMemoryIsRead) {
  EXPECT_GT(host_available_bytes(), 0u);
}

TEST(Capacity, AContextThatCannotFitIsRefusedBeforeLoading) {
  const std::string& m = cli_test::tiny_model();
  for (std::string cmd : {"run -m " + m + " -p hello -n 2 --strategy cpu -c 1000000000000",
                          "run -m " + m + " -p hello -n 2 -c 1000000000000",
                          "bench -m " + m + " -p 8 -n 0 -r 1 --strategy cpu -c 1000000000000",
                          "logits -m " + m + " --tokens 1,2 --out /dev/null -c 1000000000000"}) {
    cli_test::Result r = cli_test::tandem(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.err;
    EXPECT_EQ(cli_test::lines(r.err), 1u) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("[capacity] the model does not fit"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(1000000000000 positions, f16)"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << cmd << " printed: " << r.out;
  }
  cli_test::Result ok = cli_test::tandem("run -m " + m + " -p hello -n 2 --strategy cpu -c 4096");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

}  // namespace
}  // namespace tandem::cli
