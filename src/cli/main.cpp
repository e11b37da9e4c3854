// hybridlm: one binary, one file per subcommand (cli/*.cpp registers itself here).
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/signal_thread.h"
#include "core/simd_target.h"
#include "train/distributed.h"

int main(int argc, char** argv) {
  // glibc raises its mmap threshold to the largest block freed so far, so oneDNN's per-call GEMM packing buffers
  // (4.5 MB per thread for the LM head's logits at the bench config) move onto the heap after the first call, where
  // the heap's layout decides whether freed ones stay resident: peak RSS moved by 3 MB between builds of the same
  // code. A fixed threshold keeps blocks of 4 MiB and more on mmap, returned at free (docs/memory.md).
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  // Before any thread exists: Ctrl-C and friends are handled on a thread of their own (core/signal_thread.h).
  hlm::route_signals_to_own_thread();
  // MPI starts here when an MPI launcher started us (mpirun -np N hybridlm train ...; docs/distributed.md).
  hlm::dist::Session mpi(&argc, &argv);
  try {
    hlm::init_simd();  // an HLM_SIMD the binary cannot honour is a one-line error, before anything runs
  } catch (const hlm::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  CLI::App app{"hybridlm: build, train, evaluate and dissect hybrid language models"};
  app.require_subcommand(1);
  // The MPI line says whether this binary runs data-parallel; the SIMD line names the kernels' dispatched
  // target (HLM_SIMD forces one; docs/performance.md).
  app.set_version_flag("--version", [] {
    std::string avail;
    for (const auto& t : hlm::simd_targets_available()) avail += (avail.empty() ? "" : ", ") + t;
    return fmt::format("hybridlm 0.1.0 (MPI: {})\nSIMD kernels: {} (this CPU and binary: {})",
                       hlm::dist::built_with_mpi() ? hlm::dist::backend() : std::string("none, single-process build"),
                       hlm::simd_target(), avail);
  });
  std::vector<hlm::cli::Command> cmds = hlm::cli::all_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Flag errors read like every other error (one "error: " line naming the flag): a sweep quotes it as the reason.
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  try {
    for (auto& c : cmds)
      if (c.sub->parsed()) return c.run();
  } catch (const hlm::Interrupted& e) {
    fmt::print(stderr, "interrupted: {}\n", e.what());
    return 130;
  } catch (const std::exception& e) {
    // With several ranks the others may be waiting in a collective: end them all (MPI_Abort).
    if (hlm::dist::world_size() > 1) hlm::dist::abort(1, e.what());
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
