#pragma once
// A Slurm job-array script for independent runs (`sweep --emit-slurm`; docs/distributed.md): array task i
// runs run i of the plan with srun, resuming it when its folder already holds a checkpoint, so the same
// script can be submitted again after a time limit or a failure.
#include <string>
#include <vector>

namespace hlm::cli {

struct SlurmRun {
  std::string name, dir;
  std::vector<std::string> fresh_args, resume_args;  // `hybridlm` arguments for a new run / a resume
};

struct SlurmOptions {
  std::string job_name = "hybridlm";
  std::string exe;                  // absolute path of hybridlm (the same on every node)
  std::string log_dir;              // slurm-<job>_<task>.log files
  std::string workdir;              // the tasks run here (relative run folders in the plan resolve here)
  int ranks = 1;                    // MPI ranks per run (srun -n)
  int threads = 0;                  // OpenMP threads per rank (--cpus-per-task; 0 = leave to Slurm)
  std::vector<std::string> sbatch;  // extra #SBATCH lines, e.g. "partition=cpu", "--time=04:00:00"
};

// The script's text; hlm::Error on an empty run list or bad options (naming the flag).
std::string slurm_array_script(const std::vector<SlurmRun>& runs, const SlurmOptions& o);

// Quotes for a POSIX shell when needed (plain words stay as they are).
std::string shell_quote(const std::string& s);

}  // namespace hlm::cli
