#pragma once
// Packed documents, the one encoding every sequence kernel takes (docs/conventions.md): doc_start[b*T + t] is
// the index within row b of the first token of t's document, or the whole pointer is nullptr (one document
// per row). Documents are contiguous runs, so each entry is either the previous one or t itself.
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace hlm::ops {

// Throws, naming the op and the bad entry, unless doc_start (when given) describes contiguous documents.
inline void check_doc_start(const char* op, const int32_t* doc_start, i64 B, i64 T) {
  if (!doc_start) return;
  for (i64 b = 0; b < B; ++b)
    for (i64 t = 0; t < T; ++t) {
      const i64 d = doc_start[b * T + t];
      const bool valid = t == 0 ? d == 0 : (d == t || d == doc_start[b * T + t - 1]);
      HLM_CHECK(valid, "{}: doc_start[{}] = {} is not a document start for token {} of row {} (B={} T={})", op,
                b * T + t, d, t, b, B, T);
    }
}

// Token t > 0 starts a new document (t = 0 never does: an initial state feeds the first document of a row).
inline bool starts_document(const int32_t* doc_start, i64 T, i64 b, i64 t) {
  return doc_start != nullptr && t > 0 && doc_start[b * T + t] == t;
}

}  // namespace hlm::ops
