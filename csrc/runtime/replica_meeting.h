// One program replicated over several devices that this process drives, each replica's part
// brought by its own thread (ranks as threads of one process: tpu_dist's device path on the CPU
// plugin, a compiled graph with collectives called by each rank): the parts of the n-th launch at
// a place meet, and the last thread to arrive launches them together (Runtime::execute_replicas).
// A process that drives one replica of the program launches its part alone, without meeting.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "runtime/runtime.h"

namespace torch_tpu::runtime {

// Adds `part`, replica `mine` (0 <= mine < locals) of the `locals` replicas this process drives, to
// the next launch of `exe` at `place` (a name the participating threads share: the group and the
// program); the n-th call of each participant at a place joins the n-th launch. Returns when the
// launch is queued. Throws c10::Error, launching nothing, when the others do not arrive within
// `timeout`; rethrows the launch's error on every participant. Call without the GIL: the other
// participants may need it to arrive.
void launch_together(const std::string& place, int locals, int mine, std::shared_ptr<pjrt::Executable> exe,
                     Runtime::ReplicaPart part, std::chrono::milliseconds timeout, const std::string& name);

}  // namespace torch_tpu::runtime
