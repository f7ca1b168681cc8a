// Mixture of experts: top-k routing, the chosen experts' softmax weights, the per-expert matrix
// product (one row of the chosen expert's matrix at a time, float64) and the weighted sum.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops.h"
#include "tandem/error.h"

namespace tandem::reference {

namespace {

// Throws InvalidArgument for an expert id outside [0, n_expert): the ids come from data.
void check_expert(const char* where, int32_t id, int64_t n_expert) {
  if (id < 0 || id >= n_expert) {
    throw_error(
        ErrorCode::InvalidArgument, where,
        "expert id " + std::to_string(id) + " is not in [0, " + std::to_string(n_expert) + ")");
  }
}

// The top_k largest logits of each token, best first; ties go to the lower expert id.
void run_moe_route(const NodeExecution& e) {
  const TensorDesc& l = *e.inputs[0].desc;
  const float* logits = f32(e.inputs[0]);
  auto* ids = static_cast<int32_t*>(e.output.data);
  const int64_t n = l.ne[0], k = e.node->params.top_k;
  std::vector<bool> taken(static_cast<size_t>(n));
  for (int64_t t = 0; t < l.ne[1]; ++t) {
    const float* row = logits + t * n;
    std::fill(taken.begin(), taken.end(), false);
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t i = 0; i < n; ++i) {
        if (!taken[size_t(i)] && (best < 0 || row[i] > row[best])) best = i;
      }
      taken[size_t(best)] = true;
      ids[t * k + j] = int32_t(best);
    }
  }
}

// softmax(logits)[ids], over every expert or (normalize) over the chosen ones.
void run_moe_weights(const NodeExecution& e) {
  const TensorDesc &l = *e.inputs[0].desc, &id = *e.inputs[1].desc;
  const float* logits = f32(e.inputs[0]);
  const int32_t* ids = i32(e.inputs[1]);
  float* out = f32(e.output);
  const int64_t n = l.ne[0], k = id.ne[0];
  for (int64_t t = 0; t < l.ne[1]; ++t) {
    const float* row = logits + t * n;
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(row[i]));
    double all = 0.0;
    for (int64_t i = 0; i < n; ++i) all += std::exp(double(row[i]) - mx);
    double chosen = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      check_expert("reference moe_weights", ids[t * k + j], n);
      chosen += std::exp(double(row[ids[t * k + j]]) - mx);
    }
    const double sum = e.node->params.normalize ? chosen : all;
    for (int64_t j = 0; j < k; ++j) {
      out[t * k + j] = float(std::exp(double(row[ids[t * k + j]]) - mx) / sum);
    }
  }
}

// out[:, j, t] = a[:, :, ids[j, t]] x b[:, j or 0, t]; with a map, a[:, :, map[ids[j, t]]], or
// zeros where that is negative.
void run_expert_matmul(const NodeExecution& e) {
  const TensorDesc &a = *e.inputs[0].desc, &b = *e.inputs[1].desc, &id = *e.inputs[2].desc;
  const auto* abase = static_cast<const uint8_t*>(e.inputs[0].data);
  const float* bdata = f32(e.inputs[1]);
  const int32_t* ids = i32(e.inputs[2]);
  const bool mapped = e.inputs.size() > 3;
  const int32_t* map = mapped ? i32(e.inputs[3]) : nullptr;
  const int64_t n_map = mapped ? e.inputs[3].desc->ne[0] : 0;
  float* out = f32(e.output);
  const int64_t K = a.ne[0], M = a.ne[1], k = id.ne[0], T = id.ne[1];
  std::vector<float> arow(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int32_t expert = ids[t * k + j];
      float* ocol = out + (t * k + j) * M;
      if (mapped) {
        check_expert("reference expert_matmul", expert, n_map);
        expert = map[expert];
        if (expert < 0) {
          std::fill(ocol, ocol + M, 0.0f);
          continue;
        }
      }
      check_expert("reference expert_matmul", expert, a.ne[2]);
      const float* bcol = bdata + (t * b.ne[1] + (b.ne[1] == 1 ? 0 : j)) * K;
      for (int64_t m = 0; m < M; ++m) {
        to_f32(a.dtype, abase + expert * a.nb[2] + m * a.nb[1], arow.data(), K);
        double acc = 0.0;
        for (int64_t i = 0; i < K; ++i) acc += double(arow[size_t(i)]) * double(bcol[i]);
        ocol[m] = float(acc);
      }
    }
}

void run_moe_combine(const NodeExecution& e) {
  const TensorDesc& x = *e.inputs[0].desc;
  const float* experts = f32(e.inputs[0]);
  const float* w = f32(e.inputs[1]);
  float* out = f32(e.output);
  const int64_t n = x.ne[0], k = x.ne[1];
  for (int64_t t = 0; t < x.ne[2]; ++t)
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        acc += double(w[t * k + j]) * double(experts[(t * k + j) * n + i]);
      }
      out[t * n + i] = float(acc);
    }
}

}  // namespace

void add_moe_kernels(KernelTable<ReferenceKernel>& rows) {
  rows.add(OpKind::MoeRoute, {DType::F32, DType::I32}, run_moe_route);
  rows.add(OpKind::MoeWeights, {DType::F32, DType::I32}, run_moe_weights);
  for (DType d : float_dtypes()) {
    rows.add(OpKind::ExpertMatMul, {d, DType::F32, DType::I32}, run_expert_matmul);
  }
  for (DType d : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    rows.add(OpKind::ExpertMatMul, {d, DType::F32, DType::I32}, run_expert_matmul);
  }
  rows.add(OpKind::MoeCombine, {DType::F32}, run_moe_combine);
}

}  // namespace tandem::reference
