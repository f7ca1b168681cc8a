#include "ranks.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tandem/error.h"
#include "tandem/registry.h"

namespace tandem::cli {

namespace {

// A rank that stopped the others gives them this long to end before they are killed.
constexpr auto kStopGrace = std::chrono::seconds(10);
constexpr auto kPollInterval = std::chrono::milliseconds(20);

std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  TANDEM_CHECK_ARG(end && *end == '\0' && n >= 0 && n <= 1 << 20, name,
                   std::string("expected a whole number >= 0 (got '") + v + "')");
  return int(n);
}

double pipeline_timeout_s() {
  const int s = env_int("TANDEM_PIPELINE_TIMEOUT", int(kDefaultPipelineTimeoutS));
  TANDEM_CHECK_ARG(s > 0, "TANDEM_PIPELINE_TIMEOUT", "must be > 0 seconds");
  return double(s);
}

// The GPUs the launcher gives the ranks, in order: CUDA_VISIBLE_DEVICES's entries where it is
// set, else 0, 1, ...
std::vector<std::string> gpu_names(int count) {
  std::vector<std::string> out;
  if (const char* visible = env("CUDA_VISIBLE_DEVICES")) {
    std::stringstream ss(visible);
    for (std::string item; std::getline(ss, item, ',');) {
      if (!item.empty()) out.push_back(item);
    }
  } else {
    for (int i = 0; i < count; ++i) out.push_back(std::to_string(i));
  }
  return out;
}

std::string status_text(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "stopped";
}

// Starts n ranks of this command and waits for them; the first to fail stops the others.
int launch(int n) {
  TANDEM_CHECK_ARG(nccl_available(), "--ranks",
                   "needs a build with NCCL (this one has none: configure with CUDA and NCCL)");
  const auto ids = available_backend_ids();
  const int gpus = int(std::count_if(ids.begin(), ids.end(),
                                     [](const auto& id) { return id.starts_with("cuda:"); }));
  TANDEM_CHECK_ARG(n <= gpus, "--ranks",
                   std::to_string(n) + " ranks need " + std::to_string(n) +
                       " GPUs, one each; this machine shows " + std::to_string(gpus));
  const std::vector<std::string> devices = gpu_names(gpus);
  TANDEM_CHECK_ARG(int(devices.size()) >= n, "--ranks", "CUDA_VISIBLE_DEVICES lists too few GPUs");
  std::string dir = (std::filesystem::temp_directory_path() / "tandem-ranks-XXXXXX").string();
  if (!mkdtemp(dir.data())) {
    throw_error(ErrorCode::Io, "--ranks", "cannot create a directory in /tmp for the NCCL id");
  }
  const std::string id_file = dir + "/nccl-id";
  const std::vector<std::string>& args = command_line();
  TANDEM_CHECK_ARG(!args.empty(), "--ranks", "the command line was not recorded");
  std::fflush(stdout);
  std::fflush(stderr);

  std::vector<pid_t> pids(size_t(n), -1);
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) {
        if (p > 0) kill(p, SIGTERM);
      }
      throw_error(ErrorCode::Io, "--ranks", std::string("fork failed: ") + std::strerror(errno));
    }
    if (pid == 0) {
      // The rank: ends with the launcher, and sees only its own GPU (as cuda:0).
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      setenv("TANDEM_RANK", std::to_string(r).c_str(), 1);
      setenv("TANDEM_NRANKS", std::to_string(n).c_str(), 1);
      setenv("TANDEM_NCCL_ID_FILE", id_file.c_str(), 1);
      setenv("CUDA_VISIBLE_DEVICES", devices[size_t(r)].c_str(), 1);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "tandem: error: [rank %d] cannot start: %s\n", r, std::strerror(errno));
      _exit(127);
    }
    pids[size_t(r)] = pid;
  }

  int alive = n, exit_code = 0;
  std::string failure;
  bool stopping = false;  // SIGTERM sent; SIGKILL at kill_at
  std::chrono::steady_clock::time_point kill_at{};
  while (alive > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const auto it = std::find(pids.begin(), pids.end(), pid);
      if (it == pids.end()) continue;
      const int rank = int(it - pids.begin());
      *it = -1;
      --alive;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && failure.empty()) {
        failure = "rank " + std::to_string(rank) + " " + status_text(status);
        exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        for (pid_t p : pids) {
          if (p > 0) kill(p, SIGTERM);
        }
        stopping = true;
        kill_at = std::chrono::steady_clock::now() + kStopGrace;
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (stopping && std::chrono::steady_clock::now() > kill_at) {
      for (pid_t p : pids) {
        if (p > 0) kill(p, SIGKILL);
      }
      stopping = false;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (!failure.empty()) {
    std::fprintf(stderr, "tandem: error: [--ranks] %s; the other ranks were stopped\n",
                 failure.c_str());
    return exit_code == 0 ? 1 : exit_code;
  }
  return 0;
}

// Rank 0 writes a new communicator's id to `path` (whole, by a rename); the others wait for it.
std::string exchange_id(int rank, const std::string& path, double timeout_s) {
  if (rank == 0) {
    const std::string id = nccl_unique_id();
    const std::string partial = path + ".partial." + std::to_string(getpid());
    {
      std::ofstream f(partial);
      f << id << "\n";
      if (!f) throw_error(ErrorCode::Io, "TANDEM_NCCL_ID_FILE", "cannot write '" + partial + "'");
    }
    std::filesystem::rename(partial, path);
    return id;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    std::ifstream f(path);
    std::string id;
    if (f && std::getline(f, id) && !id.empty()) return id;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      throw_error(
          ErrorCode::Io, "TANDEM_NCCL_ID_FILE",
          "rank 0 wrote no NCCL id to '" + path + "' in " + std::to_string(int(timeout_s)) + " s");
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace

void set_command_line(int argc, char** argv) {
  command_line().assign(argv, argv + argc);
}

RankRole::RankRole(const EngineFlags& flags, SessionOptions& options) {
  TANDEM_CHECK_ARG(flags.ranks >= 0 && flags.ranks <= 64, "--ranks",
                   "must be in [1, 64] (got " + std::to_string(flags.ranks) + ")");
  if (!env("TANDEM_RANK")) {
    if (flags.ranks > 1) exit_code_ = launch(flags.ranks);
    return;
  }
  const int rank = env_int("TANDEM_RANK", 0);
  const int n = env_int("TANDEM_NRANKS", flags.ranks);
  TANDEM_CHECK_ARG(n >= 1 && rank < n, "TANDEM_RANK",
                   "rank " + std::to_string(rank) + " of TANDEM_NRANKS=" + std::to_string(n) +
                       " ranks is out of range");
  TANDEM_CHECK_ARG(
      flags.ranks == 0 || flags.ranks == n, "--ranks",
      "says " + std::to_string(flags.ranks) + " ranks, TANDEM_NRANKS " + std::to_string(n));
  if (n == 1) return;
  const char* id_file = env("TANDEM_NCCL_ID_FILE");
  TANDEM_CHECK_ARG(id_file != nullptr, "TANDEM_NCCL_ID_FILE",
                   "must name the file through which rank 0 passes the NCCL id to the others");
  const double timeout_s = pipeline_timeout_s();
  const std::string id = exchange_id(rank, id_file, timeout_s);
  auto transport = make_nccl_transport(rank, n, id, env_int("TANDEM_CUDA_DEVICE", 0), timeout_s);
  if (rank == 0) {
    id_file_ = id_file;
    transport_ = std::move(transport);
    options.pipeline = transport_;
    return;
  }
  SessionOptions serve = options;
  serve.pipeline = transport;
  serve.load_progress = {};  // rank 0's bar alone
  serve_pipeline_rank(serve);
  exit_code_ = 0;
}

RankRole::~RankRole() {
  if (!transport_) return;
  try {
    end_pipeline(*transport_);
  } catch (const std::exception&) {
    // A rank already gone: the launcher reports it.
  }
  std::error_code ignored;
  std::filesystem::remove(id_file_, ignored);
}

}  // namespace tandem::cli
