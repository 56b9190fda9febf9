// Transfers between tpu and host, and the ATen ops that cross devices (as PyTorch's OpenReg does
// them, in C++: .item(), .cpu() and .to("tpu") run without Python once their programs are known).
//
// - host -> tpu: into the whole of a dense storage, from a CPU tensor of its dtype and sizes (what
//   .to("tpu") and torch.tensor(..., device="tpu") do), a transfer ordered after the queued launches
//   and no program: a program's key holds the shape, so every new batch shape compiled one (issue 49).
//   Otherwise the CPU tensor is an operand of the lowered `copy` program, which converts its dtype,
//   broadcasts it and writes it into any (strided) tpu view.
// - tpu -> host: the tpu view is made a whole contiguous buffer of its own (a `clone` program, unless
//   it already is one or a contiguous range of a storage at most 4 times its size, which comes down
//   whole), downloaded, and copied on the CPU into the (any-strided, any-dtype) destination.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include "aten/device.h"
#include "eager/index_errors.h"
#include "eager/copies.h"
#include "eager/mode.h"
#include "eager/op_kernel.h"
#include "runtime/runtime.h"

namespace torch_tpu::eager {

const char* const kComplex32Error =
    "tpu: dtype torch.complex32 (chalf) is not supported on the tpu device: PJRT has no complex type with "
    "float16 parts. Use torch.complex64 instead (x.cfloat(), x.to(torch.complex64)), or keep complex32 "
    "tensors on the CPU.";

namespace {

int64_t g_copy_kernel = -1;

void reject_complex32(c10::ScalarType t) { TORCH_CHECK_TYPE(t != c10::ScalarType::ComplexHalf, kComplex32Error); }

// A contiguous CPU tensor with the value of the tpu tensor `src` (waits for the device).
at::Tensor to_host(const at::Tensor& src) {
  reject_complex32(src.scalar_type());
  at::Tensor out = at::empty(src.sizes(), src.options().device(c10::kCPU).pinned_memory(false));
  if (src.numel() == 0) return out;
  auto& rt = runtime::Runtime::get();
  runtime::Cell* c = aten::cell_of(src);
  rt.ensure_typed(*c, src.scalar_type());
  bool plain = *c->dtype == src.scalar_type() && src.is_contiguous() && !src.is_conj() && !src.is_neg();
  bool whole = plain && src.storage_offset() == 0 && src.numel() == c->numel;
  // A contiguous range of a storage at most 4 times its size (a bucketed graph's output at the front
  // of its bucket-sized buffer: up to 2x per dimension of two symbolic ones; a slice of rows): the
  // whole buffer comes down and the range is copied on the host, with no program (a clone's key
  // holds the shape: one per size, issue 49).
  if (plain && !whole && c->numel <= 4 * src.numel()) {
    at::Tensor all = at::empty({c->numel}, out.options());
    rt.download(*c, all.data_ptr(), all.nbytes());
    eager::raise_index_errors(c->device);
    out.view({-1}).copy_(all.narrow(0, src.storage_offset(), src.numel()));
    return out;
  }
  // A view, or a conj / neg view whose bytes are not its value: the clone program makes it whole.
  at::Tensor s = whole ? src : at::clone(src, at::MemoryFormat::Contiguous);
  runtime::Cell* sc = aten::cell_of(s);
  rt.ensure_typed(*sc, s.scalar_type());
  rt.download(*sc, out.data_ptr(), out.nbytes());
  eager::raise_index_errors(sc->device);
  return out;
}

// Host bytes kept with a storage uploaded whole (runtime::Cell::host_copy) up to this size: batches
// of token ids and masks, which a bucketed graph re-uploads at its bucket's layout.
constexpr size_t kKeepHostBytes = 256 << 10;

// host -> tpu as one ordered transfer where `self` is the whole of its dense storage and `src` a CPU
// tensor of the same dtype and sizes; false where the copy program is needed. Fused eager records
// its copies with the ops around them, so it keeps the program.
bool upload_whole(at::Tensor& self, const at::Tensor& src) {
  if (!src.is_cpu() || eager::mode() == eager::Mode::kFused || self.numel() == 0) return false;
  if (src.scalar_type() != self.scalar_type() || src.sizes() != self.sizes()) return false;
  if (src.is_conj() || src.is_neg() || self.is_conj() || self.is_neg()) return false;
  if (self.storage_offset() != 0 || !self.is_contiguous() || !src.is_contiguous()) return false;
  runtime::Cell* c = aten::cell_of(self);
  if (c->nbytes != self.nbytes() || (c->dtype && *c->dtype != self.scalar_type())) return false;
  runtime::Runtime::get().upload_ordered(*c, src.const_data_ptr(), self.scalar_type(), self.numel(), kKeepHostBytes);
  return true;
}

// The lowered device-side copy of `src` (a CPU tensor, or a tpu tensor on self's device) into self.
void device_copy(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  TORCH_CHECK(g_copy_kernel >= 0, "tpu: the copy kernel is not registered (import torch_tpu)");
  torch::jit::Stack stack{self, src, non_blocking};
  run_op_kernel(g_copy_kernel, &stack);
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (self.is_same(src)) return self;  // as ATen's copy_: nothing to do (even for an expanded view)
  if (self.is_cpu()) {
    if (src.is_cpu()) return self.copy_(src, non_blocking);
    at::Tensor host = to_host(src);
    c10::NoGradGuard no_grad;
    return self.copy_(host);
  }
  reject_complex32(self.scalar_type());
  reject_complex32(src.scalar_type());
  // Between tpu devices: through the host (the plugin has no shared memory).
  at::Tensor s = !src.is_cpu() && src.device() != self.device() ? to_host(src) : src;
  if (upload_whole(self, s)) return self;
  device_copy(self, s, non_blocking);
  return self;
}

// aten::_copy_from(src=self, dst): the transfer point used by at::native::copy_.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst;
  copy_(d, self, non_blocking);
  return d;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::Tensor d = dst;
  if (d.numel() == 0 || d.sizes() != self.sizes()) d.resize_(self.sizes());
  copy_(d, self, false);
  return d;
}

// Tensor.item(): waits for the device and returns the number.
c10::Scalar local_scalar_dense(const at::Tensor& self) { return to_host(self).item(); }

}  // namespace

void register_copy_ops(int64_t copy_kernel) {
  g_copy_kernel = copy_kernel;
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                        __LINE__);
  lib->impl("copy_", TORCH_FN(copy_));
  lib->impl("_copy_from", TORCH_FN(copy_from));
  lib->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  lib->impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
}

}  // namespace torch_tpu::eager
