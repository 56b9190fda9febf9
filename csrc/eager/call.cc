#include "eager/call.h"

#include <ATen/Context.h>

#include <c10/core/DefaultDtype.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "aten/device.h"
#include "eager/index_errors.h"
#include "runtime/runtime.h"

namespace torch_tpu::eager {
namespace {

using runtime::Cell;

// Word tags of the key: each entry starts with one, so that no two different calls share words.
enum : int64_t {
  kWNone = 1, kWHost, kWDevice, kWDeviceAt, kWDeviceAgain, kWBaked, kWScalar, kWLength, kWGenerator,
  kWVNone, kWVBool, kWVInt, kWVDouble, kWVString, kWVIntList, kWVDoubleList, kWVBoolList, kWVDevice,
  kWVList, kWVTuple, kWVComplex,
};

int64_t bits_of(double d) {
  int64_t w;
  std::memcpy(&w, &d, sizeof w);
  return w;
}

bool is_wide(c10::ScalarType t) {
  return t == c10::ScalarType::Double || t == c10::ScalarType::ComplexDouble;
}

}  // namespace

c10::ScalarType scalar_operand_dtype(const c10::Scalar& s, bool wide) {
  if (s.isBoolean()) return c10::ScalarType::Bool;
  if (s.isIntegral(false)) return c10::ScalarType::Long;
  if (s.isComplex()) return wide ? c10::ScalarType::ComplexDouble : c10::ScalarType::ComplexFloat;
  return wide ? c10::ScalarType::Double : c10::ScalarType::Float;
}

namespace {

std::string same_device_message(const std::string& a, const std::string& b) {
  return "Expected all tensors to be on the same device, but found at least two devices, " + a + " and " + b + "!";
}

class Walker {
 public:
  Walker(const Signature& sig, bool describe, Call& call) : sig_(sig), describe_(describe), call_(call) {}

  void tensor(const c10::IValue& v) {
    if (v.isNone() || (v.isTensor() && !v.toTensor().defined())) {
      word(kWNone);
      part().tag = KeyPart::kNone;
      return;
    }
    const at::Tensor& t = v.toTensor();
    auto dtype = t.scalar_type();
    if (t.is_cpu()) {
      if (t.dim() != 0 && !sig_.host_inputs)
        TORCH_CHECK(false, same_device_message("tpu:" + std::to_string(call_.device < 0 ? 0 : call_.device), "cpu"));
      int64_t pos = static_cast<int64_t>(call_.operands.size());
      words({kWHost, static_cast<int64_t>(dtype), t.dim()});
      call_.key.insert(call_.key.end(), t.sizes().begin(), t.sizes().end());
      Operand o{Operand::kHostTensor};
      o.tensor = t.resolve_conj().resolve_neg().contiguous();  // uploaded as its value
      call_.operands.push_back(std::move(o));
      if (describe_) {
        auto& p = part();
        p.tag = KeyPart::kHost;
        p.dtype = dtype;
        p.sizes = t.sizes().vec();
        p.position = pos;
      }
      return;
    }
    Cell* cell = aten::cell_of(t);
    runtime::Runtime::get().ensure_typed(*cell, dtype);
    int dev = t.device().index();
    if (call_.device < 0) {
      call_.device = dev;
    } else if (dev != call_.device) {
      TORCH_CHECK(false, same_device_message("tpu:" + std::to_string(call_.device), "tpu:" + std::to_string(dev)));
    }
    int64_t bits = (t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0);
    Slot* seen = nullptr;
    for (auto& s : slots_)
      if (s.cell == cell) seen = &s;
    bool first = seen == nullptr;
    int64_t offset = t.storage_offset();
    if (first) {
      Slot s{cell, static_cast<int64_t>(call_.operands.size()), offset, -1};
      Operand o{Operand::kCell};
      o.tensor = t;
      o.cell = cell;
      call_.operands.push_back(std::move(o));
      // A view at a nonzero offset takes its offset at run time: one program for t[i] at every i.
      if (offset != 0) {
        s.offset_position = static_cast<int64_t>(call_.operands.size());
        Operand off{Operand::kScalar};
        off.value = c10::Scalar(offset);
        off.dtype = c10::ScalarType::Long;
        call_.operands.push_back(std::move(off));
      }
      slots_.push_back(s);
      seen = &slots_.back();
    }
    // The first view of a storage: its offset is 0 (baked) or an operand. A later view of the same
    // storage: its offset relative to the first's, baked, so the key fixes how the views overlap
    // (what PyTorch's overlap checks read) and the program adds it to the first's.
    int64_t rel = first ? (offset == 0 ? 0 : seen->offset_position) : offset - seen->offset;
    int64_t tag = !first ? kWDeviceAgain : offset == 0 ? kWDevice : kWDeviceAt;
    words({tag, static_cast<int64_t>(dtype), t.dim(), rel, seen->slot, bits});
    call_.key.insert(call_.key.end(), t.sizes().begin(), t.sizes().end());
    call_.key.insert(call_.key.end(), t.strides().begin(), t.strides().end());
    if (first) {  // the program's parameter type: the storage's buffer as it is
      words({static_cast<int64_t>(*cell->dtype), static_cast<int64_t>(cell->dims.size())});
      call_.key.insert(call_.key.end(), cell->dims.begin(), cell->dims.end());
    }
    if (describe_) {
      auto& p = part();
      p.tag = KeyPart::kDevice;
      p.dtype = dtype;
      p.sizes = t.sizes().vec();
      p.strides = t.strides().vec();
      p.offset_position = seen->offset_position;
      p.offset = seen->offset_position < 0 ? offset : offset - seen->offset;
      p.slot = seen->slot;
      p.bits = bits;
      p.first = first;
      p.storage_dtype = *cell->dtype;
      p.storage_dims = cell->dims;
    }
  }

  void scalar(const c10::IValue& v) {
    if (v.isNone()) {
      word(kWNone);
      part().tag = KeyPart::kNone;
      return;
    }
    c10::Scalar s = v.toScalar();
    c10::ScalarType dt = scalar_operand_dtype(s, wide_);
    bool bakeable = s.isBoolean() || (s.isIntegral(false) && s.toLong() >= -1 && s.toLong() <= 1);
    if (bakeable) {
      words({kWBaked, static_cast<int64_t>(dt), s.toLong()});
      if (describe_) {
        auto& p = part();
        p.tag = KeyPart::kBaked;
        p.dtype = dt;
        p.baked = s;
      }
      return;
    }
    int64_t pos = static_cast<int64_t>(call_.operands.size());
    words({kWScalar, static_cast<int64_t>(dt), pos});
    Operand o{Operand::kScalar};
    o.value = s;
    o.dtype = dt;
    call_.operands.push_back(std::move(o));
    if (describe_) {
      auto& p = part();
      p.tag = KeyPart::kScalar;
      p.dtype = dt;
      p.position = pos;
    }
  }

  void length(size_t n) {
    words({kWLength, static_cast<int64_t>(n)});
    if (describe_) {
      auto& p = part();
      p.tag = KeyPart::kLength;
      p.length = static_cast<int64_t>(n);
    }
  }

  void generator(const c10::IValue* v) {
    int64_t pos = static_cast<int64_t>(call_.operands.size());
    words({kWGenerator, pos});
    Operand o{Operand::kGenerator};
    if (v && !v->isNone()) o.generator = v->toGenerator();
    call_.operands.push_back(std::move(o));
    if (describe_) {
      auto& p = part();
      p.tag = KeyPart::kGenerator;
      p.position = pos;
    }
  }

  void value(const c10::IValue& v) {
    if (!encode(v)) call_.cacheable = false;
    if (describe_) part().tag = KeyPart::kValue;
  }

  void scan_wide(const c10::IValue& v, ArgKind kind) {
    if (kind == ArgKind::kTensor && v.isTensor() && v.toTensor().defined()) {
      wide_ = wide_ || is_wide(v.toTensor().scalar_type());
    } else if (kind == ArgKind::kTensorList) {
      for (const auto& e : v.toListRef())
        if (e.isTensor() && e.toTensor().defined()) wide_ = wide_ || is_wide(e.toTensor().scalar_type());
    }
  }

 private:
  void word(int64_t w) { call_.key.push_back(w); }
  void words(std::initializer_list<int64_t> ws) { call_.key.insert(call_.key.end(), ws); }
  KeyPart& part() {
    static thread_local KeyPart scratch;
    if (!describe_) return scratch;
    call_.parts.emplace_back();
    return call_.parts.back();
  }

  bool encode(const c10::IValue& v) {
    if (v.isNone()) {
      word(kWVNone);
    } else if (v.isBool()) {
      words({kWVBool, v.toBool()});
    } else if (v.isInt()) {
      words({kWVInt, v.toInt()});
    } else if (v.isSymInt()) {
      auto i = v.toSymInt().maybe_as_int();
      if (!i) return false;
      words({kWVInt, *i});
    } else if (v.isDouble()) {
      words({kWVDouble, bits_of(v.toDouble())});
    } else if (v.isComplexDouble()) {
      auto c = v.toComplexDouble();
      words({kWVComplex, bits_of(c.real()), bits_of(c.imag())});
    } else if (v.isString()) {
      const std::string& s = v.toStringRef();
      words({kWVString, static_cast<int64_t>(s.size())});
      for (size_t i = 0; i < s.size(); i += 8) {
        int64_t w = 0;
        std::memcpy(&w, s.data() + i, std::min<size_t>(8, s.size() - i));
        word(w);
      }
    } else if (v.isIntList()) {
      auto l = v.toIntList();
      words({kWVIntList, static_cast<int64_t>(l.size())});
      for (int64_t x : l) word(x);
    } else if (v.isDoubleList()) {
      auto l = v.toDoubleList();
      words({kWVDoubleList, static_cast<int64_t>(l.size())});
      for (double x : l) word(bits_of(x));
    } else if (v.isBoolList()) {
      auto l = v.toBoolList();
      words({kWVBoolList, static_cast<int64_t>(l.size())});
      for (bool x : l) word(x);
    } else if (v.isDevice()) {
      words({kWVDevice, static_cast<int64_t>(v.toDevice().type()), v.toDevice().index()});
    } else if (v.isList()) {
      auto l = v.toListRef();
      words({kWVList, static_cast<int64_t>(l.size())});
      for (const auto& e : l)
        if (!encode(e)) return false;
    } else if (v.isTuple()) {
      const auto& e = v.toTupleRef().elements();
      words({kWVTuple, static_cast<int64_t>(e.size())});
      for (const auto& x : e)
        if (!encode(x)) return false;
    } else {
      return false;
    }
    return true;
  }

  const Signature& sig_;
  bool describe_;
  Call& call_;
  bool wide_ = false;
  // A storage of this call: its operand position (slot), the offset of its first view and, when
  // that is nonzero, the operand position of that offset (else -1).
  struct Slot {
    Cell* cell;
    int64_t slot, offset, offset_position;
  };
  std::vector<Slot> slots_;
};

}  // namespace

void describe_call(int64_t op_id, const Signature& sig, const std::string& op_name, c10::ArrayRef<c10::IValue> args,
                   bool describe, Call& call) {
  TORCH_INTERNAL_ASSERT(args.size() == sig.kinds.size(), op_name, ": ", args.size(), " arguments for ",
                        sig.kinds.size(), " schema arguments");
  Walker w(sig, describe, call);
  call.arg_count = args.size();
  call.described = describe;
  call.key.push_back(op_id);
  // torch.set_float32_matmul_precision: float32 dots and convolutions carry it in their program
  // (torch_tpu/lowering/precision.py), so a program made under another setting is another plan.
  call.key.push_back(static_cast<int64_t>(at::globalContext().float32MatmulPrecision()));
  // torch.set_default_dtype: the result dtype of an integer tensor and a Python float (uint8 + 5.5,
  // true_divide of integers) is the default dtype, which the meta kernel read when the plan was made.
  call.key.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  for (size_t i = 0; i < args.size(); ++i) w.scan_wide(args[i], static_cast<ArgKind>(sig.kinds[i]));
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    switch (static_cast<ArgKind>(sig.kinds[i])) {
      case ArgKind::kTensor: w.tensor(v); break;
      case ArgKind::kTensorList: {
        auto l = v.toListRef();
        w.length(l.size());
        for (const auto& e : l) w.tensor(e);
        break;
      }
      case ArgKind::kScalar: w.scalar(v); break;
      case ArgKind::kScalarList: {
        auto l = v.toListRef();
        w.length(l.size());
        for (const auto& e : l) w.scalar(e);
        break;
      }
      case ArgKind::kGenerator: w.generator(&v); break;
      case ArgKind::kValue: w.value(v); break;
    }
  }
  TORCH_CHECK(call.device >= 0, op_name, ": no tpu tensor among the arguments");
  if (sig.index_status) w.tensor(c10::IValue(index_status(call.device)));
  if (sig.default_generator) w.generator(nullptr);
}

}  // namespace torch_tpu::eager
