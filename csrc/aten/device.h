// PrivateUse1 ("tpu") device integration: the current-device state shared by the device guard,
// the hooks and the allocator, and the default generators.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace torch_tpu::runtime {
struct Cell;
}

namespace torch_tpu::aten {

// The storage cell behind a tpu tensor. Raises (RuntimeError) for a tensor on another device.
runtime::Cell* cell_of(const at::Tensor& t);

// A new tpu tensor on `device` whose storage no program has written yet: row-major, or with
// `strides` when given (a dense permutation, e.g. channels_last: the storage holds numel elements).
at::Tensor new_tpu_tensor(c10::IntArrayRef shape, c10::ScalarType dtype, int device,
                          const std::vector<int64_t>* strides = nullptr);

// Tells t's storage, before its first typed use, what it was allocated for: t's sizes in memory
// order when t is a dense tensor covering the whole storage (runtime::Runtime::hint_layout).
void hint_layout(const at::Tensor& t);

// The index of the device that `index` names. In a multi-process job whose process drives one device
// (torchrun's LOCAL_WORLD_SIZE > 1; Google TorchTPU's convention: each process sees its device as
// tpu:0), LOCAL_RANK names that device too, so that CUDA-habit code (`torch.device(f"tpu:{local_rank}")`,
// `set_device(local_rank)`, DDP's device_ids=[local_rank]) runs unchanged: tpu:LOCAL_RANK is tpu:0.
// Every other index is returned as it is.
c10::DeviceIndex own_device(c10::DeviceIndex index);

// The device count that CUDA-habit code sees (torch.accelerator.device_count(), torch.tpu.device_count(),
// DeviceMesh's devices per host). In a multi-process job on this host whose processes each drive one
// device (LOCAL_WORLD_SIZE > 1 and the plugin shows this process one device), it is LOCAL_WORLD_SIZE,
// as CUDA shows every process all the host's GPUs: scripts that check `device_count() >= nproc` start,
// and index LOCAL_RANK (as 0) names this process's device. The other indices name the other
// processes' devices, which this process cannot use (check_device_index says so). Otherwise the
// plugin's addressable device count. Never throws; 0 when no plugin can start.
c10::DeviceIndex visible_device_count() noexcept;

// The thread's current tpu device index (torch.tpu.current_device()).
c10::DeviceIndex current_device();
// Sets it (own_device(index)); throws a clear error when `index` is not a device of the running plugin.
void set_device(c10::DeviceIndex index);
// Throws a clear error unless 0 <= own_device(index) < device count.
void check_device_index(c10::DeviceIndex index);

// Default generator of tpu:index (index -1: the current device).
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);

// Advances `gen` (a tpu generator, or when undefined the default generator of tpu:`device`, the
// device the random op runs on, as CUDA's ops take their tensor's device's generator) by
// `increment` draws and returns the (seed, offset) the caller's random program should use.
std::pair<uint64_t, uint64_t> generator_next(const std::optional<at::Generator>& gen, uint64_t increment,
                                             c10::DeviceIndex device);

}  // namespace torch_tpu::aten
