#pragma once
// The one door to MPI (docs/distributed.md). Everything above it (trainer, CLI) asks for the world size
// and rank and calls these collectives; model/, mixers/ and ops/ never see MPI. Built without MPI
// (HLM_MPI=OFF, or no MPI found) the same functions exist for one process: world size 1, rank 0, and
// every collective is a no-op on its buffer.
//
// MPI is started only when a launcher started this process (mpirun / mpiexec / srun set their
// variables), so a plain `hybridlm ...` never pays for MPI's singleton start-up.
#include <cstdint>
#include <string>

namespace hlm::dist {

// "OpenMPI 4.1.4" style name of the MPI library this binary was built with, or "none".
std::string backend();
bool built_with_mpi();

// Starts MPI for the life of the object when launched by an MPI launcher (one per process, in main).
class Session {
 public:
  Session(int* argc, char*** argv);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

int rank();
int world_size();
inline bool is_root() { return rank() == 0; }
// Ranks on this node (shared memory) and this rank's index among them.
int local_size();
int local_rank();
// OpenMP threads for this rank when the user gave none: 0 (OpenMP's own choice) when OMP_NUM_THREADS is
// set; the CPUs the launcher bound the rank to when it bound it to a part of the node; else the node's
// CPUs shared evenly by the ranks on the node (at least 1).
int default_threads();

// In-place sums over all ranks. The float version reduces `n` floats in buckets of `bucket_floats`
// (several reductions in flight at once; 0 = one reduction of the whole buffer).
void allreduce_sum(float* data, std::int64_t n, std::int64_t bucket_floats = 0);
void allreduce_sum(double* data, std::int64_t n);
// True on every rank when `flag` is true on any rank.
bool any(bool flag);
// True on every rank when every rank passed the same value.
bool all_equal(std::uint64_t value);
// Rank `root`'s bytes to every rank.
void broadcast(void* data, std::int64_t bytes, int root = 0);
void broadcast(std::string& s, int root = 0);
void barrier();
// Ends every rank now (MPI_Abort) after printing `message` on this rank; plain exit without MPI.
[[noreturn]] void abort(int code, const std::string& message);

}  // namespace hlm::dist
