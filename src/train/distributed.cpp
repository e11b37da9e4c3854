#include "train/distributed.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#ifdef HLM_HAVE_MPI
#include <mpi.h>
#endif

namespace hlm::dist {

namespace {

int g_rank = 0, g_size = 1, g_local_rank = 0, g_local_size = 1;

#ifdef HLM_HAVE_MPI
bool g_active = false;  // MPI_Init ran (launched by an MPI launcher)

bool launched_by_mpi() {
  // OpenMPI's mpirun, PMIx (OpenMPI 5, srun --mpi=pmix), PMI-1/2 (MPICH's hydra, srun --mpi=pmi2).
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  abort(1, fmt::format("{} failed: {}", what, std::string(msg, static_cast<size_t>(len))));
}

// MPI counts are ints: no single call moves more than 2^30 elements.
constexpr std::int64_t kMaxCount = std::int64_t{1} << 30;
#endif

}  // namespace

bool built_with_mpi() {
#ifdef HLM_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::string backend() {
#ifdef HLM_HAVE_MPI
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);  // callable before MPI_Init
  std::string s(v, static_cast<size_t>(len));
  // "Open MPI v4.1.4, package: ..." -> the part before the first comma.
  s = s.substr(0, s.find(','));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
#else
  return "none";
#endif
}

Session::Session(int* argc, char*** argv) {
#ifdef HLM_HAVE_MPI
  if (!launched_by_mpi()) return;
  int provided = 0;
  // Only the main thread calls MPI; OpenMP threads work between the calls.
  check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  g_active = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &g_local_rank);
  MPI_Comm_size(node, &g_local_size);
  MPI_Comm_free(&node);
#else
  (void)argc;
  (void)argv;
#endif
}

Session::~Session() {
#ifdef HLM_HAVE_MPI
  if (g_active) MPI_Finalize();
  g_active = false;
#endif
}

int rank() { return g_rank; }
int world_size() { return g_size; }
int local_rank() { return g_local_rank; }
int local_size() { return g_local_size; }

int default_threads() {
  if (std::getenv("OMP_NUM_THREADS")) return 0;
  const long node = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const int bound = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : static_cast<int>(node);
  if (bound < node) return std::max(1, bound);  // mpirun --bind-to core/socket, srun --cpus-per-task
  return std::max(1, static_cast<int>(node) / g_local_size);
}

void allreduce_sum(float* data, std::int64_t n, std::int64_t bucket_floats) {
#ifdef HLM_HAVE_MPI
  if (g_size == 1 || n <= 0) return;
  const std::int64_t bucket = bucket_floats > 0 ? std::min(bucket_floats, kMaxCount) : kMaxCount;
  std::vector<MPI_Request> reqs;
  for (std::int64_t off = 0; off < n; off += bucket) {
    const int count = static_cast<int>(std::min(bucket, n - off));
    reqs.emplace_back();
    check(MPI_Iallreduce(MPI_IN_PLACE, data + off, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &reqs.back()),
          "MPI_Iallreduce");
  }
  check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
#else
  (void)data, (void)n, (void)bucket_floats;
#endif
}

void allreduce_sum(double* data, std::int64_t n) {
#ifdef HLM_HAVE_MPI
  if (g_size == 1 || n <= 0) return;
  for (std::int64_t off = 0; off < n; off += kMaxCount)
    check(MPI_Allreduce(MPI_IN_PLACE, data + off, static_cast<int>(std::min(kMaxCount, n - off)), MPI_DOUBLE,
                        MPI_SUM, MPI_COMM_WORLD),
          "MPI_Allreduce");
#else
  (void)data, (void)n;
#endif
}

bool any(bool flag) {
#ifdef HLM_HAVE_MPI
  if (g_size == 1) return flag;
  int v = flag ? 1 : 0;
  check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD), "MPI_Allreduce");
  return v != 0;
#else
  return flag;
#endif
}

bool all_equal(std::uint64_t value) {
#ifdef HLM_HAVE_MPI
  if (g_size == 1) return true;
  std::uint64_t lo = value, hi = value;
  check(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  check(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return lo == hi;
#else
  (void)value;
  return true;
#endif
}

void broadcast(void* data, std::int64_t bytes, int root) {
#ifdef HLM_HAVE_MPI
  if (g_size == 1) return;
  auto* p = static_cast<char*>(data);
  for (std::int64_t off = 0; off < bytes; off += kMaxCount)
    check(MPI_Bcast(p + off, static_cast<int>(std::min(kMaxCount, bytes - off)), MPI_BYTE, root, MPI_COMM_WORLD),
          "MPI_Bcast");
#else
  (void)data, (void)bytes, (void)root;
#endif
}

void broadcast(std::string& s, int root) {
  if (g_size == 1) return;
  std::uint64_t n = s.size();
  broadcast(&n, sizeof n, root);
  s.resize(n);
  broadcast(s.data(), static_cast<std::int64_t>(n), root);
}

void barrier() {
#ifdef HLM_HAVE_MPI
  if (g_size > 1) check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

void abort(int code, const std::string& message) {
  if (g_size > 1) std::fprintf(stderr, "error (rank %d of %d): %s\n", g_rank, g_size, message.c_str());
  else std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
#ifdef HLM_HAVE_MPI
  if (g_active) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace hlm::dist
