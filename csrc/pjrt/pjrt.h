// TorchTPU's PJRT layer: loading a PJRT C API plugin and RAII handles over its objects.
//
// Built against the `pjrt_c_api.h` that the installed plugin wheel carries (xla-cpu-pjrt ships it
// as xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h); nothing here includes torch, so this layer
// compiles in seconds and could be unit-tested alone.
//
// Every PJRT_Error is turned into a `PjrtError` (a std::runtime_error) carrying the plugin's
// message, its absl status code and what we were doing ("compile", "execute", ...).
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "pjrt_c_api.h"

namespace torch_tpu::pjrt {

// An error reported by the plugin, or a failure to load one.
// `code` is the PJRT_Error_Code (absl numbering; 0 when the error is ours, e.g. a bad path).
class PjrtError : public std::runtime_error {
 public:
  PjrtError(std::string msg, int code) : std::runtime_error(std::move(msg)), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// The oldest PJRT C API minor version whose PJRT_Api holds every slot we call (0.57: from there on
// every header is a strict prefix of the later ones).
constexpr int kMinApiMinor = 57;

// A dlopen'ed plugin. `path` is the .so; `env_var` names the variable that chose it, so that every
// loading error can tell the user what to change. Throws PjrtError when the file is missing, is not
// a PJRT plugin (no GetPjrtApi), or reports an API version we do not support.
class Plugin {
 public:
  Plugin(const std::string& path, const std::string& env_var);
  // The process's one Plugin for `path`, loaded and initialized on the first call: the executing
  // client and compile-only topologies of the same plugin (libtpu on a TPU VM) share it, as
  // PJRT_Plugin_Initialize is meant to run once per plugin. Throws as the constructor does.
  static std::shared_ptr<Plugin> load(const std::string& path, const std::string& env_var);
  const PJRT_Api* api() const { return api_; }
  int api_major() const { return major_; }
  int api_minor() const { return minor_; }
  const std::string& path() const { return path_; }
  // Throws PjrtError (with `what` prefixed) if `err` is non-null; always destroys `err`.
  void check(PJRT_Error* err, const char* what) const;
  // Destroys `err` (if non-null) without raising: for destructors, which must not throw.
  void drop(PJRT_Error* err) const;
  // PJRT_Plugin_Attributes ("xla_version", "stablehlo_current_version", ...): integer and list values
  // in `ints`, strings in `strings`, as DeviceDescription has them.
  void attributes(std::map<std::string, std::vector<int64_t>>* ints,
                  std::map<std::string, std::string>* strings) const;

 private:
  std::string path_;
  const PJRT_Api* api_ = nullptr;
  int major_ = 0, minor_ = 0;
};

class Client;
class Event;

// In a process forked after a plugin was loaded, called in the child once every other at-fork handler
// has run (Python's os.register_at_fork after_in_child): the child then ends, when it calls exit()
// after Python has finalized, without the C exit handlers registered before (this one runs first:
// the last registered), with its exit status. A plugin's may wait on threads the child does not
// have: libtpu's flushes its log sink through its logger thread and hung forked children forever
// (absl FlushLogSinks -> threadlogger ThreadLogWrapper::Write). Does nothing where no plugin was loaded.
void end_child_without_exit_handlers();

// The serialized xla.CompileOptionsProto that Client::compile sends (1 replica, 1 partition, a
// portable executable). Compile-only targets take the same bytes by default, so that an executable
// built ahead of time is the one the runtime would build on the target.
const std::string& default_compile_options();

// The serialized xla.CompileOptionsProto for a program run as one replica on each of `device_ids`
// (the target's global device ids, replica r on device_ids[r]; 1 partition): what a collective over
// those devices is compiled with (replica_groups name replica indices). One id 0, or none, gives
// default_compile_options().
std::string replica_compile_options(const std::vector<int64_t>& device_ids);

// default_compile_options() with XLA's backend optimization level (DebugOptions
// xla_backend_optimization_level: LLVM's -O level on the CPU and GPU backends; XLA's default is 3)
// set for this program only, through CompileOptionsProto.env_option_overrides.
std::string compile_options_at_level(int level);

// One PJRT_Buffer (a dense array on one device). Destroyed (PJRT_Buffer_Destroy) when the last
// shared_ptr goes; donated buffers are destroyed too, as PJRT requires.
class Buffer {
 public:
  Buffer(std::shared_ptr<Client> client, PJRT_Buffer* buf) : client_(std::move(client)), buf_(buf) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  PJRT_Buffer* get() const { return buf_; }
  PJRT_Buffer_Type element_type() const;
  std::vector<int64_t> dims() const;
  size_t on_device_size() const;
  // Copies the whole buffer into `dst` (`size` bytes, dense row-major) and waits for it.
  // Async execution errors of the program that produced this buffer surface here.
  void to_host(void* dst, size_t size) const;
  // Blocks until the buffer's value is computed; throws the producing program's error if any.
  void await_ready() const;
  bool is_deleted() const;

  // The last execution issued that reads or writes this buffer (null: none yet). Kept by the
  // runtime, under its lock, to tell whether donating the buffer would make a launch wait.
  std::shared_ptr<Event> last_use;

 private:
  std::shared_ptr<Client> client_;
  PJRT_Buffer* buf_;
};

// A compiled, loaded program, or one still compiling (runtime/compile_pool.h): a *pending*
// executable knows its outputs from its program text, so a launch can be queued at once; get()
// waits for the compile and rethrows its error.
class Executable {
 public:
  Executable(std::shared_ptr<Client> client, PJRT_LoadedExecutable* exe, size_t num_outputs)
      : client_(std::move(client)), exe_(exe), num_outputs_(num_outputs) {}
  // Pending: `compiled` gives the loaded executable (whose outputs must be these) or the compile's error.
  Executable(std::vector<PJRT_Buffer_Type> types, std::vector<std::vector<int64_t>> dims,
             std::shared_future<std::shared_ptr<Executable>> compiled)
      : output_types(std::move(types)), output_dims(std::move(dims)), exe_(nullptr),
        num_outputs_(output_types.size()), compiled_(std::move(compiled)) {}
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;
  // The loaded executable; for a pending one, waits for its compile (throws what the compile threw).
  PJRT_LoadedExecutable* get() const { return compiled_.valid() ? compiled_.get()->get() : exe_; }
  size_t num_outputs() const { return num_outputs_; }
  void set_num_outputs(size_t n) { num_outputs_ = n; }
  // Element type and dimensions of each output, read once at compile time (pending: as its program declares).
  std::vector<PJRT_Buffer_Type> output_types;
  std::vector<std::vector<int64_t>> output_dims;
  // PJRT_Executable_SizeOfGeneratedCodeInBytes, read when loaded: the host memory the program's
  // code holds (what the runtime's in-memory caches bound); -1 where the plugin does not say (the
  // compile cache then sets the serialized program's size, where it has it).
  int64_t code_bytes = -1;

 private:
  std::shared_ptr<Client> client_;
  PJRT_LoadedExecutable* exe_;
  size_t num_outputs_;
  std::shared_future<std::shared_ptr<Executable>> compiled_;  // valid only for a pending executable
};

// Memory statistics of one device, where the plugin reports them (-1 when not).
// What PJRT_DeviceDescription tells of one device: its kind ("cpu", "TPU v5 lite", ...), global id,
// owning process, and the plugin's attributes (e.g. a TPU's "coords" and "core_on_chip"). Integer
// and integer-list attributes are in `ints`, string ones in `strings`.
struct DeviceDescription {
  std::string kind;
  int64_t id = 0;
  int64_t process_index = 0;
  std::map<std::string, std::vector<int64_t>> ints;
  std::map<std::string, std::string> strings;
};

struct MemoryStats {
  int64_t bytes_in_use = -1, peak_bytes_in_use = -1, num_allocs = -1, bytes_limit = -1;
};

// One PJRT_Event (e.g. the completion of one execution), destroyed with this object.
class Event {
 public:
  Event(std::shared_ptr<Client> client, PJRT_Event* ev) : client_(std::move(client)), ev_(ev) {}
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // PJRT_Event_IsReady: true once the event has happened (with or without an error). Never blocks.
  bool is_ready() const;
  // PJRT_Event_OnReady: calls `fn` once the event has happened, on a plugin thread or (if it has
  // already happened) at once, with "" or the error's message. `fn` must not throw.
  void on_ready(std::function<void(const std::string& error)> fn) const;

 private:
  std::shared_ptr<Client> client_;
  PJRT_Event* ev_;
};

// A PJRT_Client over the plugin's addressable devices.
// A key-value store shared by the processes of a multi-process job, through which a plugin's
// clients find each other: PJRT_Client_Create's kv_get / kv_try_get / kv_put callbacks (libtpu's
// and the CUDA plugin's multi-process set-up; the CPU plugin ignores them). Thread-safe.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // The value of `key`, waiting up to `timeout_ms` for a process to put it; throws on timeout.
  virtual std::string get(const std::string& key, int timeout_ms) = 0;
  // The value of `key` if it is there now.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  virtual void put(const std::string& key, const std::string& value) = 0;
};

// The C callbacks a plugin is given for a KeyValueStore (its pointer is their user_arg): failures
// become PJRT errors made with the plugin's callback_error (a missing key NOT_FOUND, a timeout
// DEADLINE_EXCEEDED); values are handed out with a deleter, as PJRT requires.
struct KeyValueCallbacks {
  PJRT_KeyValueGetCallback get;
  PJRT_KeyValueTryGetCallback try_get;
  PJRT_KeyValuePutCallback put;
};
const KeyValueCallbacks& key_value_callbacks();

class Client : public std::enable_shared_from_this<Client> {
 public:
  // `int_options` become PJRT_NamedValue int64 create options (e.g. cpu_device_count). `kv`, where
  // given, backs the client's key-value callbacks for as long as the client lives.
  static std::shared_ptr<Client> create(std::shared_ptr<Plugin> plugin,
                                        const std::vector<std::pair<std::string, int64_t>>& int_options,
                                        std::shared_ptr<KeyValueStore> kv = nullptr);
  // The key-value store the client was created with (null: none).
  const std::shared_ptr<KeyValueStore>& key_value_store() const { return kv_; }
  ~Client();
  const Plugin& plugin() const { return *plugin_; }
  const std::string& platform_name() const { return platform_name_; }
  const std::string& platform_version() const { return platform_version_; }
  size_t device_count() const { return devices_.size(); }
  PJRT_Device* device(int64_t index) const;
  MemoryStats memory_stats(int64_t index) const;
  DeviceDescription describe(int64_t index) const;

  // Compiles StableHLO (MLIR text or bytecode, format "mlir") with a serialized
  // xla.CompileOptionsProto; empty: default_compile_options(), one replica and one partition, a
  // portable executable that runs on any addressable device. With replica_compile_options(ids) the
  // executable runs one replica on each of those devices (execute_replicas).
  std::shared_ptr<Executable> compile(const std::string& mlir, const std::string& options = {}) const;
  // The plugin's serialized form of `exe` (loads only on the same plugin build), and back.
  std::string serialize(const Executable& exe) const;
  std::shared_ptr<Executable> deserialize(const std::string& bytes) const;

  // Copies `data` (dense row-major, `dims`) to device `index`. Waits until the host data is no
  // longer needed, so the caller may free it on return.
  std::shared_ptr<Buffer> buffer_from_host(const void* data, PJRT_Buffer_Type type,
                                           const std::vector<int64_t>& dims, int64_t index);
  // A buffer that may alias `data` (PJRT's kImmutableZeroCopy: where device memory is host memory,
  // as on the CPU plugin, no copy is made). `data` must stay valid and unchanged until `release`
  // is called (from a plugin thread, or at once when the plugin copied it).
  std::shared_ptr<Buffer> buffer_aliasing_host(const void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims,
                                               int64_t index, std::function<void()> release);
  // The same for small host data (scalars, step counts): the plugin copies it during the call.
  std::shared_ptr<Buffer> small_buffer_from_host(const void* data, PJRT_Buffer_Type type,
                                                 const std::vector<int64_t>& dims, int64_t index);

  // Runs `exe` on device `index` with `args`; returns its outputs. Does not wait for the result.
  // Arguments the program aliases to an output are donated (they become deleted), except the
  // positions in `non_donatable` (PJRT_ExecuteOptions.non_donatable_input_indices): the output
  // is then a fresh buffer. If `done` is given, it receives the execution's completion event.
  std::vector<std::shared_ptr<Buffer>> execute(const Executable& exe,
                                               const std::vector<PJRT_Buffer*>& args,
                                               int64_t index,
                                               const std::vector<int64_t>& non_donatable = {},
                                               std::shared_ptr<Event>* done = nullptr);
  // Runs `exe`, compiled for one replica on each of several devices (replica_compile_options), on
  // the addressable ones among them: args[k] are the arguments of the k-th addressable device of its
  // device assignment, in assignment order (all of them in one process on the CPU plugin; one per
  // process on a multi-process TPU or GPU job). Returns each device's outputs and, where `done` is
  // given, fills it with each device's completion event. No argument is donated.
  std::vector<std::vector<std::shared_ptr<Buffer>>> execute_replicas(
      const Executable& exe, const std::vector<std::vector<PJRT_Buffer*>>& args,
      std::vector<std::shared_ptr<Event>>* done = nullptr);
  // PJRT_Buffer_OnDeviceSizeInBytes of a buffer not owned here.
  size_t on_device_size(PJRT_Buffer* buf) const;

  PJRT_Client* get() const { return client_; }

 private:
  Client(std::shared_ptr<Plugin> plugin) : plugin_(std::move(plugin)) {}
  // One host -> device transfer with `semantics`. Without `release`, waits until the host data is
  // no longer needed; with it, returns at once and calls `release` when that is so.
  std::shared_ptr<Buffer> transfer(const void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims,
                                   int64_t index, PJRT_HostBufferSemantics semantics,
                                   std::function<void()> release);
  // Takes ownership of `loaded` and reads its output count, types and dimensions.
  std::shared_ptr<Executable> wrap_loaded(PJRT_LoadedExecutable* loaded) const;
  std::shared_ptr<Plugin> plugin_;
  std::shared_ptr<KeyValueStore> kv_;  // outlives client_: the plugin may call back until it is destroyed
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
  std::string platform_name_, platform_version_;
};

// What a compiler says of one program it compiled for a topology (read when it is compiled; the
// PJRT_Executable itself is not kept).
struct CompiledProgram {
  std::string serialized;  // PJRT_Executable_Serialize: loads on a client of the same plugin build
  size_t num_outputs = 0;
  // PJRT_Executable_GetCostAnalysis: "flops", "bytes accessed", "transcendentals",
  // "optimal_seconds" (libtpu: negative where its cost model cannot time the program), ...
  std::map<std::string, double> cost;
  // PJRT_Executable_GetCompiledMemoryStats, in bytes of device memory (-1: not reported).
  int64_t code_bytes = -1, argument_bytes = -1, output_bytes = -1, alias_bytes = -1, temp_bytes = -1,
          peak_bytes = -1;
};

// A compile-only target: a plugin's description of a device topology (libtpu's "v5e:2x2"), for which
// PJRT_Compile builds executables without a client or a chip. Destroyed with this object.
class Topology {
 public:
  // PJRT_TopologyDescription_Create with `name` and int64 create options (libtpu: "num_slices").
  // Throws PjrtError with the plugin's message for a name or option it does not know.
  static std::shared_ptr<Topology> create(std::shared_ptr<Plugin> plugin, const std::string& name,
                                          const std::vector<std::pair<std::string, int64_t>>& int_options);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
  const Plugin& plugin() const { return *plugin_; }
  const std::string& name() const { return name_; }
  const std::string& platform_name() const { return platform_name_; }
  const std::string& platform_version() const { return platform_version_; }
  // Every device of the topology, in the plugin's order (stable within a process).
  std::vector<DeviceDescription> devices() const;
  // PJRT_Compile of StableHLO (format "mlir") for this topology with a serialized
  // xla.CompileOptionsProto (empty: default_compile_options()). Throws PjrtError with the
  // compiler's message. Thread-safe: compiles may run on several threads at once.
  CompiledProgram compile(const std::string& mlir, const std::string& options) const;

 private:
  Topology(std::shared_ptr<Plugin> plugin) : plugin_(std::move(plugin)) {}
  std::shared_ptr<Plugin> plugin_;
  PJRT_TopologyDescription* topology_ = nullptr;
  std::string name_, platform_name_, platform_version_;
};

}  // namespace torch_tpu::pjrt
