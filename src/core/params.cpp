#include "core/params.h"

#include "core/error.h"

namespace hlm {

int ParamRegistry::add(const std::string& name, Shape shape, Init init, double a, double b, bool decay,
                       bool fuse_with_previous) {
  if (index_.count(name)) fail("ParamRegistry: duplicate tensor name '{}'", name);
  if (!fuse_with_previous) total_ = (total_ + 15) / 16 * 16;
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.offset = total_;
  p.decay = decay;
  p.init = init;
  p.init_a = a;
  p.init_b = b;
  total_ += shape.numel();
  params_.push_back(p);
  index_[name] = static_cast<int>(params_.size()) - 1;
  return static_cast<int>(params_.size()) - 1;
}

int ParamRegistry::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

i64 ParamRegistry::count() const {
  i64 n = 0;
  for (auto& p : params_) n += p.shape.numel();
  return n;
}

}  // namespace hlm
