// Which nodes a fused RoPE / KV-cache-write launch takes (rope_kv.h).
#include "rope_kv.h"

#include <cmath>

namespace tandem::cuda {

size_t match_rope_kv_write(std::span<const NodeExecution> segment, RopeKvMatch* m) {
  *m = RopeKvMatch{};
  if (segment.empty()) return 0;
  RopeKvParts& parts = m->parts;
  const TensorRef*& positions = m->positions;
  auto same_positions = [&](const TensorRef& p) {
    if (p.desc->dtype != DType::I32 || !p.desc->is_contiguous()) return false;
    if (!positions) positions = &p;
    return p.data == positions->data && p.desc->ne == positions->desc->ne;
  };
  size_t n = 0;
  int& n_rot = m->n_rot;
  float& freq_base = m->freq_base;
  const OpKind rope_op = segment[0].node->op;
  parts.neox = rope_op == OpKind::RopeNeox;
  while (n < segment.size() && n < 2 && segment[n].node->op == rope_op &&
         (rope_op == OpKind::Rope || rope_op == OpKind::RopeNeox)) {
    const NodeExecution& e = segment[n];
    const TensorDesc& x = *e.inputs[0].desc;
    if (!contiguous_f32(e.inputs[0]) || !contiguous_f32(e.output) || !same_positions(e.inputs[1]) ||
        positions->desc->ne[0] != x.ne[2] || x.ne[3] != 1 ||
        (n > 0 && (e.node->params.n_rot != n_rot || e.node->params.freq_base != freq_base))) {
      break;
    }
    n_rot = e.node->params.n_rot;
    freq_base = e.node->params.freq_base;
    RopeKvPart& p = parts.part[size_t(parts.count++)];
    p.src = static_cast<const float*>(e.inputs[0].data);
    p.out = static_cast<float*>(e.output.data);
    p.d = x.ne[0];
    p.heads = x.ne[1];
    p.n = x.elements();
    p.rotate = true;
    ++n;
  }
  const size_t ropes = n;
  while (n < segment.size() && n < ropes + 2 && segment[n].node->op == OpKind::KvWrite) {
    const NodeExecution& e = segment[n];
    const TensorDesc& cache = *e.output.desc;
    const TensorDesc& src = *e.inputs[1].desc;
    if (!contiguous_f32(e.inputs[1]) || !same_positions(e.inputs[2]) ||
        positions->desc->ne[0] != src.ne[2] || src.ne[3] != 1 ||
        (cache.dtype != DType::F32 && cache.dtype != DType::F16) || cache.ne[0] != src.ne[0] ||
        cache.ne[1] != src.ne[1] || cache.nb[1] != cache.nb[0] * cache.ne[0]) {
      break;
    }
    // The K write reads what a Rope of this launch writes: that part writes the cache too.
    RopeKvPart* p = nullptr;
    for (size_t r = 0; r < ropes; ++r) {
      if (parts.part[r].out == e.inputs[1].data && parts.part[r].n == src.elements() &&
          !parts.part[r].cache) {
        p = &parts.part[r];
      }
    }
    if (!p) {
      p = &parts.part[size_t(parts.count++)];
      p->src = static_cast<const float*>(e.inputs[1].data);
      p->d = src.ne[0];
      p->heads = src.ne[1];
      p->n = src.elements();
    }
    p->cache = static_cast<uint8_t*>(e.output.data);
    p->token_stride = cache.nb[2];
    p->capacity = cache.ne[2];
    p->cache_dtype = cache.dtype;
    ++n;
  }
  return n;
}

bool attention_follows(std::span<const NodeExecution> segment, const RopeKvMatch& m) {
  if (segment.size() < 5 || m.parts.neox || m.parts.count != 3 || !m.positions ||
      m.positions->desc->elements() != 1) {
    return false;
  }
  const RopeKvPart &q = m.parts.part[0], &k = m.parts.part[1], &v = m.parts.part[2];
  const int64_t d = q.d;
  if (!q.rotate || q.cache || !k.rotate || !k.cache || v.rotate || !v.cache || k.d != d ||
      v.d != d || v.heads != k.heads || d % 2 != 0 || m.n_rot % 2 != 0 || m.n_rot <= 0 ||
      m.n_rot > d) {
    return false;
  }
  const NodeExecution& a = segment[4];
  if (a.node->op != OpKind::Attention || a.inputs.size() != 4) return false;
  const TensorDesc& qd = *a.inputs[0].desc;
  const TensorDesc& kd = *a.inputs[1].desc;
  const TensorDesc& vd = *a.inputs[2].desc;
  const bool same_layout = kd.dtype == k.cache_dtype && vd.dtype == v.cache_dtype &&
                           kd.dtype == vd.dtype && kd.ne == vd.ne && kd.nb == vd.nb &&
                           kd.ne[0] == d && kd.ne[1] == k.heads && kd.ne[2] == k.capacity &&
                           kd.nb[2] == k.token_stride && vd.nb[2] == v.token_stride;
  return a.inputs[0].data == q.out && contiguous_f32(a.inputs[0]) && qd.ne[0] == d &&
         qd.ne[1] == q.heads && qd.elements() == q.n && a.inputs[1].data == k.cache &&
         a.inputs[2].data == v.cache && same_layout && a.inputs[3].data == m.positions->data;
}

size_t match_rope_kv_attention(std::span<const NodeExecution> segment, RopeKvMatch* m) {
  return match_rope_kv_write(segment, m) == 4 && attention_follows(segment, *m) ? 5 : 0;
}

size_t rope_tail_of(std::span<const NodeExecution> segment, size_t n, RopeTail* tail) {
  if (n != 3 || segment.size() < n + 4 || segment[0].inputs[1].desc->ne[1] != 1) return 0;
  RopeKvMatch m;
  if (match_rope_kv_write(segment.subspan(n), &m) != 4 || m.parts.neox || m.parts.count != 3 ||
      m.positions->desc->elements() != 1) {
    return 0;
  }
  // Part j is product j's output: Q rotated, K rotated and cached, V cached; one head size.
  const int64_t d = m.parts.part[0].d;
  if (d % 2 != 0 || m.n_rot % 2 != 0 || m.n_rot <= 0 || m.n_rot > d) return 0;
  RopeTail t;
  for (int j = 0; j < kMaxParts; ++j) {
    const RopeKvPart& p = m.parts.part[size_t(j)];
    if (p.src != segment[size_t(j)].output.data ||
        p.n != segment[size_t(j)].output.desc->elements() || p.d != d || p.rotate != (j < 2) ||
        (p.cache == nullptr) != (j == 0) || (j == 2 && p.cache_dtype != t.cache_dtype)) {
      return 0;
    }
    t.out[j] = p.out;
    t.cache[j] = p.cache;
    t.token_stride[j] = p.token_stride;
    t.capacity[j] = p.capacity;
    if (p.cache) t.cache_dtype = p.cache_dtype;
  }
  t.pos = static_cast<const int32_t*>(m.positions->data);
  t.log_base = std::log(double(m.freq_base));
  t.n_rot = m.n_rot;
  t.head_dim = int(d);
  *tail = t;
  return 4;
}

}  // namespace tandem::cuda
