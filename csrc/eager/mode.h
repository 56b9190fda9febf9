// The eager mode ops run in: debug (launch and wait), strict (asynchronous, the default) or fused
// (recorded, then run as one program). See torch_tpu/eager/modes.py.
//
// The mode is per thread, as PyTorch's grad mode is: a thread follows the process default
// (TORCH_TPU_EAGER_MODE at import, torch_tpu.set_eager_mode) unless it is inside an
// eager_mode(...) block. The block's mode is kept as c10 thread-local debug info, which PyTorch
// carries into the work a thread starts elsewhere: autograd's device threads run a backward in the
// mode of the thread that called backward(), as they run it with its grad mode.
#pragma once

#include <optional>

namespace torch_tpu::eager {

enum class Mode : int { kDebug = 0, kStrict = 1, kFused = 2 };

// This thread's mode: its innermost eager_mode block's, else the process default.
Mode mode();
void set_default_mode(Mode m);
// The innermost block's mode on this thread; nullopt outside any block.
std::optional<Mode> thread_mode();
// Enters / leaves a block (strictly nested, as the Python context manager does).
void push_thread_mode(Mode m);
void pop_thread_mode();

}  // namespace torch_tpu::eager
