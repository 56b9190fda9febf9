// One call of a lowered ATen overload, as the eager cache sees it: its key and its operands.
//
// The key holds, per argument in schema order (this is the one implementation of the eager cache
// key; torch_tpu/eager/kernel.py builds programs from the same description):
//  - tpu tensor: dtype, sizes, strides, which storage of this call it lives in (its slot), its lazy
//    conj/neg bits, and the storage's dtype and element count the first time a slot is seen. Its
//    storage offset: the first view of a storage at offset 0 is keyed as such; at another offset,
//    the offset is an int64 operand (a loop over t[i] is one program, issue 49); a later view of the
//    same storage keys its offset relative to the first's (which fixes how the two overlap);
//  - CPU tensor (a 0-dim operand, or any CPU tensor for ops that take host inputs): dtype and sizes;
//  - Scalar: its type only (its value travels as an operand, so a new learning rate recompiles
//    nothing), except 0, 1 and -1 of integer and bool type, which are baked into the program;
//    floats travel in double precision when a tensor argument is float64/complex128, else single;
//  - Generator: its operand position (the program takes the (seed, offset) state);
//  - anything else (dims, flags, dtypes, lists of ints): its value.
// Operands are what a program may take: one per storage slot (and its first view's nonzero offset),
// per CPU tensor, per non-baked Scalar and per generator.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Scalar.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torch_tpu::runtime {
struct Cell;
}

namespace torch_tpu::eager {

// How an argument enters the key (from its schema type).
enum class ArgKind : char {
  kTensor = 'T',      // Tensor, Tensor?
  kTensorList = 'L',  // Tensor[], Tensor?[]
  kScalar = 'S',      // Scalar, Scalar?
  kScalarList = 'Q',  // Scalar[]
  kGenerator = 'G',   // Generator?
  kValue = 'V',       // everything else, by value
};

// The dtype a Scalar argument takes in a program: bool, int64 for integers, and for floats
// (complex) double (complex128) precision when `wide` (a tensor argument is float64/complex128),
// else single. The one rule, for eager keys and compiled graphs' constants alike.
c10::ScalarType scalar_operand_dtype(const c10::Scalar& s, bool wide);

struct Operand {
  enum Kind : uint8_t { kCell, kHostTensor, kScalar, kGenerator } kind;
  at::Tensor tensor;                  // kCell: a tensor of the storage; kHostTensor: the CPU tensor
  runtime::Cell* cell = nullptr;      // kCell
  c10::Scalar value;                  // kScalar
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // kScalar: its operand dtype
  std::optional<at::Generator> generator;              // kGenerator (nullopt: the default one)
};

// One key entry, kept when a call is described for Python (a cache miss or a slow-path run).
struct KeyPart {
  enum Tag : uint8_t { kNone, kHost, kDevice, kBaked, kScalar, kLength, kGenerator, kValue } tag = kNone;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  // kDevice: offset is the view's storage offset when offset_position is -1 (baked into the program),
  // else what the program adds to the int64 operand at offset_position (the storage's first view's).
  int64_t offset = 0, offset_position = -1, slot = -1, position = -1, length = 0, bits = 0;
  bool first = false;  // kDevice: first use of its slot (carries the storage's dtype and dims)
  c10::ScalarType storage_dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> storage_dims;
  c10::Scalar baked;
};

struct Call {
  std::vector<int64_t> key;        // hashed words: the cache key (the op's id first)
  std::vector<Operand> operands;
  std::vector<KeyPart> parts;      // filled only when `describe` was asked
  int device = -1;
  size_t arg_count = 0;            // schema arguments (on the dispatcher stack)
  bool cacheable = true;           // false when an argument has no key encoding (always the slow path)
  bool described = false;          // parts filled (describe_call's `describe`)
};

// What the key needs to know about an overload.
struct Signature {
  std::string kinds;                // one ArgKind per schema argument
  bool host_inputs = false;         // CPU tensors of any size are operands (copy)
  bool default_generator = false;   // a random op without a Generator argument: one operand last
  bool index_status = false;        // checks indices on the device: the device's status is an operand, last
};

// Builds the key and operands of the call whose arguments are `args` (schema order). Raises
// PyTorch's errors for tensors on different devices and for a call without a tpu tensor.
void describe_call(int64_t op_id, const Signature& sig, const std::string& op_name, c10::ArrayRef<c10::IValue> args,
                   bool describe, Call& call);

}  // namespace torch_tpu::eager
