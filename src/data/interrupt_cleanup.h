#pragma once
// Ctrl-C (SIGINT) and SIGTERM during a dataset build end it promptly in every phase (reading documents,
// training the tokenizer, tokenising) and leave no `<name>.tmp-PID-N` behind. While a guard lives:
// - where the signal has its default action, the first one kills the tokenizer trainer's child process, deletes
//   the files of every guarded folder and the folders themselves (async-signal-safe system calls only; the
//   folders are flat), then dies of the signal as before (the shell sees exit 130);
// - where the process goes on after the signal (ignored, as in a background job of a script, or handled by its
//   owner, like the trainer's Ctrl-C save), the handler kills the child, raises the flag that the build checks
//   between documents and pieces of text (it throws hlm::Interrupted; the build's own cleanup removes the folder)
//   and calls the owner's handler, which so still sees the signal.
// The previous actions come back when the last guard ends.
#include <sys/types.h>

#include <string>

namespace hlm::data {

class InterruptCleanup {
 public:
  explicit InterruptCleanup(const std::string& folder);
  ~InterruptCleanup();
  InterruptCleanup(const InterruptCleanup&) = delete;
  InterruptCleanup& operator=(const InterruptCleanup&) = delete;

 private:
  int slot_ = -1;  // -1: more concurrent builds than slots; the next build clears this one's folder instead
};

// A signal arrived while a guard lives (and the process went on); cleared when the last guard ends.
bool build_interrupted();
// Throws hlm::Interrupted naming `what` (the phase) when build_interrupted().
void throw_if_build_interrupted(const char* what);
// The child process a build waits for (the SentencePiece trainer): the handler kills it (SIGKILL). 0: none.
void set_build_child(pid_t pid);

}  // namespace hlm::data
