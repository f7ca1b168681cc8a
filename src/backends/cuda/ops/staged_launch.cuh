// The host side of the staged matrix-vector kernel (staged_matvec.cuh): the layout and the
// instance a launch takes, for staged_matvec.cu (Q4_0, Q8_0) and staged_matvec_k.cu (K-quants).
#pragma once

#include <algorithm>
#include <span>

#include "staged_matvec.cuh"

namespace tandem::cuda::staged {

// Launches the staged kernel for one node, or for several that share b (one part each), when
// the layout allows it; false leaves them to the generic kernel (strided or unaligned weights, K
// not a multiple of 256, too little shared memory).
template <DType kType, int kCols>
bool launch_staged(const OpContext& ctx, std::span<const NodeExecution> execs,
                   const NormedB* norm = nullptr, float* glu = nullptr,
                   const RopeTail* rope = nullptr) {
  const NodeExecution& first = execs.front();
  const TensorDesc& a0 = *first.inputs[0].desc;
  const TensorDesc& b = *first.inputs[1].desc;
  const int64_t K = a0.ne[0];
  const auto* bp = static_cast<const float*>(first.inputs[1].data);
  const bool fused = execs.size() > 1;
  // Tiles are copied in 16-byte pieces: rows of Q6_K (210-byte groups) need K % 2048 == 0.
  if (K % kGroupElems != 0 || row_bytes(kType, K) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(bp) % 16 != 0 || !b.is_contiguous() ||
      execs.size() > size_t(kMaxParts) || (fused && b.ne[2] * b.ne[3] != 1)) {
    return false;
  }
  MatvecParts parts{};
  parts.count = int(execs.size());
  for (size_t i = 0; i < execs.size(); ++i) {
    const TensorDesc& a = *execs[i].inputs[0].desc;
    const auto* ap = static_cast<const uint8_t*>(execs[i].inputs[0].data);
    if (a.dtype != kType || a.ne[0] != K || size_t(a.nb[1]) != row_bytes(kType, K) ||
        a.nb[2] % 16 != 0 || a.nb[3] % 16 != 0 || reinterpret_cast<uintptr_t>(ap) % 16 != 0 ||
        execs[i].inputs[1].data != first.inputs[1].data || execs[i].inputs[1].desc->ne != b.ne ||
        execs[i].inputs[1].desc->nb != b.nb || (fused && a.ne[2] * a.ne[3] != 1) ||
        parts.row_start[i] + a.ne[1] > int64_t(INT32_MAX)) {
      return false;
    }
    parts.a[i] = ap;
    parts.out[i] = static_cast<float*>(execs[i].output.data);
    parts.row_start[i + 1] = int(parts.row_start[i] + a.ne[1]);
  }
  const int64_t M = parts.row_start[parts.count];
  // With glu the CTAs split gate's rows (and take the same rows of up).
  if (glu && (kCols != 1 || parts.count != 2 || 2 * int64_t(parts.row_start[1]) != M)) return false;
  // With rope they split row pairs: every part starts at an even row.
  auto even_parts = [&] {
    return std::all_of(parts.row_start, parts.row_start + parts.count + 1,
                       [](int r) { return r % 2 == 0; });
  };
  if (rope && (kCols != 1 || glu || b.ne[2] * b.ne[3] != 1 || !even_parts())) return false;
  const int64_t unit = rope ? 2 : 1;
  const int64_t split_rows = (glu ? M / 2 : M) / unit;  // in units of `unit` rows
  // One CTA per SM: a second would leave the next kernel no room.
  const int64_t ctas = std::min<int64_t>(ctx.sm_count, split_rows),
                cta_rows = rope ? unit * ((split_rows + ctas - 1) / ctas) : (M + ctas - 1) / ctas;
  // Two CTAs per SM (this kernel's and the next one's; two columns, kStagedMinBlocks) only where
  // half an SM's shared memory still holds tiles for 12 warps: with fewer (wide rows, Q8_0) one
  // CTA alone with a deeper ring measured faster (bench/NOTES.md).
  constexpr bool kMayPair = kStagedMinBlocks<kType, kCols> >= 2;
  static_assert(!(kMayPair && kBulkTiles<kType, kCols>), "a pair's layout holds no mbarriers");
  const bool bulk = kBulkTiles<kType, kCols> && (kType == DType::Q8_0 || K >= kBulkMinK);
  bool pair = kMayPair;
  StagedLayout l =
      staged_layout<kType>(K, kCols, ctx.smem_pair, kPairStages, cta_rows, parts.count);
  if (!pair || l.total > ctx.smem_pair || l.threads < 384) {
    pair = false;
    l = staged_layout<kType>(K, kCols, ctx.smem_optin, kAloneStages<kType, kCols>, cta_rows,
                             parts.count, kAloneTargetBytes<kType, kCols>, bulk);
  }
  if (l.total > ctx.smem_optin) return false;
  // The GLU only where a CTA's share of each part is a few tiles (latency-bound products: 1B
  // Q4_0 tg128 +3%). Where each part streams more than kLongTiles tiles a CTA, the split into two
  // ranges costs a partial tile each and the separate SwiGLU overlaps the next product's first
  // fetches (8B Q4_0 -2.5%; H100, bench/NOTES.md).
  if (glu && split_rows > int64_t(kLongTiles) * l.rows * ctas) return false;
  // b in registers: one column, and a thread's group of b the same in every tile.
  const bool reg_b = kCols == 1 && l.rows > 1;
  if ((glu || rope) && !reg_b) return false;  // the GLU's and RoPE's kernels keep b in registers
  // A normed b: every item of it held by the CTA's threads at once (two each), b in registers.
  if (norm && (kCols != 1 || !reg_b || b.ne[2] * b.ne[3] != 1 || K / 16 > 2 * int64_t(l.threads))) {
    return false;
  }
  RopeTail tail = rope ? *rope : RopeTail{};
  tail.error_flag = ctx.error_flag;
  auto launch = [&](auto kernel) {
    ctx.check(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.total)),
        "quantized_matmul", "cudaFuncSetAttribute");
    ctx.check(launch_programmatic(ctx.stream, dim3(unsigned(ctas), unsigned(b.ne[2] * b.ne[3])),
                                  dim3(unsigned(l.threads)), l.total, kernel, parts,
                                  int64_t(a0.nb[2]), int64_t(a0.nb[3]), int(b.ne[2] / a0.ne[2]),
                                  int(b.ne[3] / a0.ne[3]), int(b.ne[2]), int(split_rows / ctas),
                                  int(split_rows % ctas), l.gpr, l.rows, l.stage_bytes, l.red_tiles,
                                  uint32_t(l.b_scale), uint32_t(l.stages), uint32_t(l.reduce),
                                  uint32_t(l.bars), bp, norm ? *norm : NormedB{}, glu, tail),
              norm ? "rms_norm + quantized_matmul" : "quantized_matmul", "launch");
  };
  // A ring of `stages` tiles, copied by cp.async or (use_bulk) the bulk copy engine.
  auto launch_ring_copies = [&](auto stages, auto use_bulk) {
    constexpr int kStages = decltype(stages)::value;
    constexpr bool kB = decltype(use_bulk)::value;
    constexpr int kEarly = kPreIssue<kType, kCols, kStages, kB>;
    if constexpr (kCols == 1) {
      if (glu) {
        return norm ? launch(staged_matvec_kernel<kType, 1, kStages, true, kEarly, true, true,
                                                  false, kB>)
                    : launch(staged_matvec_kernel<kType, 1, kStages, true, kEarly, false, true,
                                                  false, kB>);
      }
      if (rope) {
        return norm ? launch(staged_matvec_kernel<kType, 1, kStages, true, kEarly, true, false,
                                                  true, kB>)
                    : launch(staged_matvec_kernel<kType, 1, kStages, true, kEarly, false, false,
                                                  true, kB>);
      }
      if (norm) {
        return launch(
            staged_matvec_kernel<kType, 1, kStages, true, kEarly, true, false, false, kB>);
      }
    }
    reg_b
        ? launch(staged_matvec_kernel<kType, kCols, kStages, kCols == 1, kEarly, false, false,
                                      false, kB>)
        : launch(
              staged_matvec_kernel<kType, kCols, kStages, false, kEarly, false, false, false, kB>);
  };
  auto launch_ring = [&](auto stages) {
    if constexpr (kBulkTiles<kType, kCols>) {
      if (bulk) return launch_ring_copies(stages, std::true_type{});
    }
    launch_ring_copies(stages, std::false_type{});
  };
  using Pair = std::integral_constant<int, kPairStages>;
  using Solo = std::integral_constant<int, kAloneStages<kType, kCols>>;
  if constexpr (kMayPair) {
    if (pair) {
      launch_ring(Pair{});
      return true;
    }
  }
  launch_ring(Solo{});
  return true;
}

}  // namespace tandem::cuda::staged
