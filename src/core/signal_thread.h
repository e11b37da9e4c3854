#pragma once
// Asynchronous signals (Ctrl-C's SIGINT, SIGTERM, SIGUSR1) are handled on one idle thread of their own.
//
// Why: a handled signal pushes its frame (several KB of register state with AVX-512) at the stack pointer of
// the thread it interrupts. The JIT sgemm kernels of the oneDNN that Debian ships (2.6) point the stack pointer
// into a heap workspace while they run, so a Ctrl-C landing inside one wrote its frame into the heap: the
// trainer then died in malloc ("corrupted size vs. prev_size") instead of saving (docs/reliability.md). With
// these signals blocked in every other thread, the kernel can deliver them only to the idle thread, whose
// stack runs no kernel. The handlers themselves (train/trainer.cpp, data/interrupt_cleanup.cpp,
// study/child_process.cpp) are unchanged: they set flags or clean up and re-raise, from any thread.

namespace hlm {

// Blocks the routed signals in the calling thread and starts the idle thread that alone unblocks them. Call
// it first in main(), before any other thread exists (MPI, OpenMP, oneDNN): threads inherit the mask of the
// thread that creates them. Idempotent. A signal the process started with blocked stays blocked.
void route_signals_to_own_thread();

// In a forked child, before exec: the signal mask the process started with (async-signal-safe), so the
// program it runs can be interrupted as usual.
void restore_startup_signal_mask();

}  // namespace hlm
