#pragma once
// A non-owning view of a float (or int) array with a shape and row-major strides. Ops take raw
// pointers plus sizes (llm.c style); views are for the parameter registry, checkpoints and tests.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"

namespace hlm {

using i64 = std::int64_t;

constexpr int kMaxDims = 4;

struct Shape {
  int ndim = 0;
  std::array<i64, kMaxDims> dims{};

  Shape() = default;
  Shape(std::initializer_list<i64> d) {
    HLM_CHECK(d.size() <= kMaxDims, "Shape: at most {} dims, got {}", kMaxDims, d.size());
    for (i64 x : d) dims[ndim++] = x;
  }
  static Shape from(const std::vector<i64>& d) {
    Shape s;
    HLM_CHECK(d.size() <= kMaxDims, "Shape: at most {} dims, got {}", kMaxDims, d.size());
    for (i64 x : d) s.dims[s.ndim++] = x;
    return s;
  }
  i64 numel() const {
    i64 n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  i64 operator[](int i) const { return dims[i]; }
  std::vector<i64> vec() const { return {dims.begin(), dims.begin() + ndim}; }
  bool operator==(const Shape& o) const { return vec() == o.vec(); }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }
};

template <typename T>
struct View {
  T* data = nullptr;
  Shape shape;
  std::array<i64, kMaxDims> strides{};

  View() = default;
  View(T* d, Shape s) : data(d), shape(s) {
    i64 st = 1;
    for (int i = s.ndim - 1; i >= 0; --i) {
      strides[i] = st;
      st *= s.dims[i];
    }
  }
  i64 numel() const { return shape.numel(); }
  T& operator()(i64 i) const { return data[i * strides[0]]; }
  T& operator()(i64 i, i64 j) const { return data[i * strides[0] + j * strides[1]]; }
  T& operator()(i64 i, i64 j, i64 k) const {
    return data[i * strides[0] + j * strides[1] + k * strides[2]];
  }
  T& operator()(i64 i, i64 j, i64 k, i64 l) const {
    return data[i * strides[0] + j * strides[1] + k * strides[2] + l * strides[3]];
  }
};

using TensorView = View<float>;

}  // namespace hlm
