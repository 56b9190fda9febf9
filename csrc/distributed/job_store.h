// The key-value store of a multi-process job for PJRT clients (pjrt::KeyValueStore): a c10d Store,
// torchrun's own by default, so that libtpu's and the CUDA plugin's processes find each other through
// the store the job already rendezvoused on.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "pjrt/pjrt.h"

namespace torch_tpu::distributed {

// `store` as a pjrt::KeyValueStore (get waits with c10d's Store::wait, then reads the value).
std::shared_ptr<pjrt::KeyValueStore> key_value_store(c10::intrusive_ptr<c10d::Store> store);

// torchrun's store for this job: a client of the elastic agent's TCPStore at MASTER_ADDR:MASTER_PORT,
// under the prefix "torch_tpu/pjrt/<TORCHELASTIC_RESTART_COUNT>/" (a restarted job starts clean).
// Throws c10::Error naming the variables when they are missing or the store cannot be reached.
std::shared_ptr<pjrt::KeyValueStore> torchrun_key_value_store();

}  // namespace torch_tpu::distributed
