#include "train/data_stream.h"

namespace hlm {

void ShardBatchStream::next(Batch& b) {
  if (!loader_.next(tmp_)) {
    loader_.reset();  // sequential streams wrap around
    loader_.next(tmp_);
  }
  b.B = tmp_.B;
  b.T = tmp_.T;
  b.inputs.swap(tmp_.inputs);
  b.targets.swap(tmp_.targets);
  b.doc_start.swap(tmp_.doc_start);
}

}  // namespace hlm
