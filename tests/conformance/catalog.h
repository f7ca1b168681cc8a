// What the case generators share (cases.cpp: the hand-picked shapes; edge_cases.cpp: shapes
// drawn around the kernels' block and tile edges): the catalog under construction, leaves from
// shape vectors and readable names.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "harness.h"
#include "tandem/hash.h"

namespace tandem::conformance {

using Shape = std::vector<int64_t>;

inline bool quantized(DType d) {
  return dtype_traits(d).is_quantized;
}

// "37x3x2"
inline std::string dims(const Shape& s) {
  std::string out;
  for (int64_t v : s) {
    if (!out.empty()) out += 'x';
    out += std::to_string(v);
  }
  return out;
}

inline std::string dt(DType d) {
  return std::string(dtype_name(d));
}

// Leaves from a shape vector (the Graph API takes initializer lists).
inline TensorId leaf(Graph& g, OpKind op, const std::string& name, DType dtype, const Shape& s) {
  Dims ne{1, 1, 1, 1};
  for (size_t i = 0; i < s.size(); ++i) ne[i] = s[i];
  return g.leaf(op, make_tensor_desc(name, dtype, ne, int(s.size())));
}
inline TensorId input(Graph& g, const std::string& name, DType dtype, const Shape& s) {
  return leaf(g, OpKind::Input, name, dtype, s);
}
inline TensorId weight(Graph& g, const std::string& name, DType dtype, const Shape& s) {
  return leaf(g, OpKind::Weight, name, dtype, s);
}

class Catalog {
 public:
  explicit Catalog(bool large) : large_(large) {}

  // Adds a hand-picked case (a repeated name is left for the catalog test to report).
  void add(std::string name, Graph g, std::vector<LeafFill> fills = {}) {
    names_.insert(test_name("x", name));
    push(std::move(name), std::move(g), std::move(fills));
  }
  // Adds a drawn case unless one of the same name is already there; false if it was.
  bool add_drawn(std::string name, Graph g, std::vector<LeafFill> fills = {}) {
    if (!names_.insert(test_name("x", name)).second) return false;
    push(std::move(name), std::move(g), std::move(fills));
    return true;
  }
  bool large() const { return large_; }
  std::vector<Case> take() { return std::move(cases_); }

 private:
  void push(std::string name, Graph g, std::vector<LeafFill> fills) {
    Case c;
    c.name = std::move(name);
    c.graph = std::move(g);
    c.fills = std::move(fills);
    c.threshold = threshold_for(c.graph, c.node());
    cases_.push_back(std::move(c));
  }

  bool large_;
  std::vector<Case> cases_;
  std::set<std::string> names_;
};

// Deterministic choices for drawn shapes: the same seed gives the same catalog on every machine.
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_{seed} {}
  int64_t below(int64_t n) { return int64_t(rng_.next() % uint64_t(n)); }
  bool percent(int p) { return below(100) < p; }
  template <class T>
  T pick(const std::vector<T>& v) {
    return v[size_t(below(int64_t(v.size())))];
  }
  int64_t pick(std::initializer_list<int64_t> v) { return v.begin()[below(int64_t(v.size()))]; }

 private:
  SplitMix64 rng_;
};

// Adds the edge cases: every op, every dtype combination, shapes drawn around the edges the
// CPU and CUDA kernels split work at (edge_cases.cpp).
void add_edge_cases(Catalog& cat);

}  // namespace tandem::conformance
