// Implementation of the PJRT layer declared in pjrt.h. Struct sizes come from the plugin's own
// header (`*_STRUCT_SIZE`); plugins accept a struct at least as large as the one they know.
#include "pjrt/pjrt.h"

#include <dlfcn.h>
#include <elf.h>
#include <unistd.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

namespace torch_tpu::pjrt {
namespace {

template <typename T>
T make_args(size_t size) {
  T a;
  std::memset(&a, 0, sizeof(T));
  a.struct_size = size;
  return a;
}
#define PJRT_ARGS(T) make_args<T>(T##_STRUCT_SIZE)

// Byte offset of a function slot in PJRT_Api; a plugin older than our header may lack it.
#define PJRT_HAS_SLOT(api, fn) (offsetof(PJRT_Api, fn) + sizeof(void*) <= (api)->struct_size)

// Serialized xla.CompileOptionsProto: executable_build_options (3) {num_replicas (4) = 1,
// num_partitions (5) = 1}, compile_portable_executable (4) = true. An empty proto aborts the
// plugin (CHECK on replica_count > 0), so these are always sent.
const char kCompileOptions[] = {0x1A, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};

// Integer, list and string named values into `ints` / `strings` (bools as 0/1; floats dropped: none
// that matter here).
void read_named_values(const PJRT_NamedValue* values, size_t n, std::map<std::string, std::vector<int64_t>>* ints,
                       std::map<std::string, std::string>* strings) {
  for (size_t i = 0; i < n; ++i) {
    const PJRT_NamedValue& v = values[i];
    std::string name(v.name, v.name_size);
    switch (v.type) {
      case PJRT_NamedValue_kString: (*strings)[name].assign(v.string_value, v.value_size); break;
      case PJRT_NamedValue_kInt64: (*ints)[name] = {v.int64_value}; break;
      case PJRT_NamedValue_kInt64List: (*ints)[name].assign(v.int64_array_value, v.int64_array_value + v.value_size); break;
      case PJRT_NamedValue_kBool: (*ints)[name] = {v.bool_value ? 1 : 0}; break;
      default: break;
    }
  }
}

std::vector<PJRT_NamedValue> int_named_values(const std::vector<std::pair<std::string, int64_t>>& options) {
  std::vector<PJRT_NamedValue> opts(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    std::memset(&opts[i], 0, sizeof(PJRT_NamedValue));
    opts[i].struct_size = PJRT_NamedValue_STRUCT_SIZE;
    opts[i].name = options[i].first.c_str();
    opts[i].name_size = options[i].first.size();
    opts[i].type = PJRT_NamedValue_kInt64;
    opts[i].int64_value = options[i].second;
    opts[i].value_size = 1;
  }
  return opts;
}

DeviceDescription read_description(const Plugin& plugin, PJRT_DeviceDescription* desc) {
  const PJRT_Api* api = plugin.api();
  DeviceDescription out;
  auto k = PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
  k.device_description = desc;
  plugin.check(api->PJRT_DeviceDescription_Kind(&k), "PJRT_DeviceDescription_Kind");
  out.kind.assign(k.device_kind, k.device_kind_size);
  auto i = PJRT_ARGS(PJRT_DeviceDescription_Id_Args);
  i.device_description = desc;
  plugin.check(api->PJRT_DeviceDescription_Id(&i), "PJRT_DeviceDescription_Id");
  out.id = i.id;
  auto pi = PJRT_ARGS(PJRT_DeviceDescription_ProcessIndex_Args);
  pi.device_description = desc;
  plugin.check(api->PJRT_DeviceDescription_ProcessIndex(&pi), "PJRT_DeviceDescription_ProcessIndex");
  out.process_index = pi.process_index;
  auto at = PJRT_ARGS(PJRT_DeviceDescription_Attributes_Args);
  at.device_description = desc;
  plugin.check(api->PJRT_DeviceDescription_Attributes(&at), "PJRT_DeviceDescription_Attributes");
  read_named_values(at.attributes, at.num_attributes, &out.ints, &out.strings);
  return out;
}

// A PJRT_Program of StableHLO text (format "mlir"); `mlir` must outlive it.
PJRT_Program mlir_program(const std::string& mlir) {
  auto prog = PJRT_ARGS(PJRT_Program);
  prog.code = const_cast<char*>(mlir.data());
  prog.code_size = mlir.size();
  static const char kFormat[] = "mlir";
  prog.format = kFormat;
  prog.format_size = sizeof(kFormat) - 1;
  return prog;
}

}  // namespace

const std::string& default_compile_options() {
  static const std::string options(kCompileOptions, sizeof(kCompileOptions));
  return options;
}

namespace {

void put_varint(std::string& out, uint64_t v) {
  do {
    uint8_t byte = v & 0x7F;
    v >>= 7;
    out.push_back(static_cast<char>(byte | (v ? 0x80 : 0)));
  } while (v);
}

// A protobuf field: varint (wire type 0) or length-delimited (2).
void put_varint_field(std::string& out, int number, uint64_t v) {
  put_varint(out, static_cast<uint64_t>(number) << 3);
  put_varint(out, v);
}
void put_bytes_field(std::string& out, int number, const std::string& bytes) {
  put_varint(out, (static_cast<uint64_t>(number) << 3) | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

}  // namespace

std::string replica_compile_options(const std::vector<int64_t>& device_ids) {
  if (device_ids.size() <= 1 && (device_ids.empty() || device_ids[0] == 0)) return default_compile_options();
  // xla.DeviceAssignmentProto: replica_count (1), computation_count (2), computation_devices (3) =
  // one ComputationDevice {replica_device_ids (1), packed}.
  std::string ids;
  for (int64_t id : device_ids) put_varint(ids, static_cast<uint64_t>(id));
  std::string computation;
  put_bytes_field(computation, 1, ids);
  std::string assignment;
  put_varint_field(assignment, 1, device_ids.size());
  put_varint_field(assignment, 2, 1);
  put_bytes_field(assignment, 3, computation);
  // ExecutableBuildOptionsProto: num_replicas (4), num_partitions (5), device_assignment (9).
  std::string build;
  put_varint_field(build, 4, device_ids.size());
  put_varint_field(build, 5, 1);
  put_bytes_field(build, 9, assignment);
  std::string options;  // CompileOptionsProto: executable_build_options (3); not portable
  put_bytes_field(options, 3, build);
  return options;
}

std::string compile_options_at_level(int level) {
  // xla.OptionOverrideProto: int_field (3). CompileOptionsProto.env_option_overrides (7): a
  // map<string, OptionOverrideProto>, each entry {key (1), value (2)}; the plugin applies it to the
  // program's DebugOptions after XLA_FLAGS (CompileOptions::ApplyAllOptionOverrides).
  std::string value;
  put_varint_field(value, 3, static_cast<uint64_t>(level));
  std::string entry;
  put_bytes_field(entry, 1, "xla_backend_optimization_level");
  put_bytes_field(entry, 2, value);
  std::string options = default_compile_options();
  put_bytes_field(options, 7, entry);
  return options;
}

namespace {
std::atomic<bool> plugin_loaded{false};

void flush_and_end(int status, void*) {
  std::fflush(nullptr);
  _exit(status);
}
}  // namespace

void end_child_without_exit_handlers() {
  if (plugin_loaded.load()) on_exit(flush_and_end, nullptr);
}

// Why a 64-bit ELF file cannot be loaded whole ("" when it can, or is not ELF: dlopen says why then).
// A truncated copy (an interrupted download or copy) passes dlopen, which maps the missing pages
// lazily; the first call that reaches them dies of SIGBUS. Every loadable segment and the section
// header table must lie within the file.
static std::string truncated_elf(const std::string& path, off_t size) {
  std::ifstream f(path, std::ios::binary);
  Elf64_Ehdr eh{};
  if (!f.read(reinterpret_cast<char*>(&eh), sizeof(eh)) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64) {
    return {};
  }
  uint64_t need = eh.e_shoff + static_cast<uint64_t>(eh.e_shnum) * eh.e_shentsize;
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    f.seekg(static_cast<std::streamoff>(eh.e_phoff + static_cast<uint64_t>(i) * eh.e_phentsize));
    if (!f.read(reinterpret_cast<char*>(&ph), sizeof(ph))) return "its program headers are cut off";
    if (ph.p_type == PT_LOAD) need = std::max<uint64_t>(need, ph.p_offset + ph.p_filesz);
  }
  if (need <= static_cast<uint64_t>(size)) return {};
  return "the file is truncated (" + std::to_string(size) + " bytes; its ELF headers describe " +
         std::to_string(need) + ")";
}

Plugin::Plugin(const std::string& path, const std::string& env_var) : path_(path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    throw PjrtError("PJRT plugin not found at '" + path + "' (chosen by " + env_var +
                        "). Set " + env_var + " to cpu, cuda, tpu or the path of a PJRT plugin .so.",
                    0);
  }
  std::string damaged = truncated_elf(path, st.st_size);
  if (!damaged.empty()) {
    throw PjrtError("Cannot load '" + path + "' as a PJRT plugin (chosen by " + env_var + "): " + damaged +
                        ". Reinstall it, or set " + env_var + " to cpu, cuda, tpu or the path of a PJRT plugin .so.",
                    0);
  }
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    throw PjrtError("Cannot load '" + path + "' as a PJRT plugin (chosen by " + env_var +
                        "): " + (e ? e : "dlopen failed") + ". Set " + env_var +
                        " to cpu, cuda, tpu or the path of a PJRT plugin .so.",
                    0);
  }
  using GetApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(dlsym(handle, "GetPjrtApi"));
  if (!get_api) {
    throw PjrtError("'" + path + "' (chosen by " + env_var +
                        ") is not a PJRT plugin: it has no GetPjrtApi symbol.",
                    0);
  }
  api_ = get_api();
  if (!api_) throw PjrtError("GetPjrtApi() of '" + path + "' returned null.", 0);
  major_ = api_->pjrt_api_version.major_version;
  minor_ = api_->pjrt_api_version.minor_version;
  if (major_ != PJRT_API_MAJOR || minor_ < kMinApiMinor ||
      !PJRT_HAS_SLOT(api_, PJRT_Executable_OutputDimensions)) {
    throw PjrtError("PJRT plugin '" + path + "' (chosen by " + env_var + ") reports C API " +
                        std::to_string(major_) + "." + std::to_string(minor_) +
                        "; TorchTPU supports " + std::to_string(PJRT_API_MAJOR) + "." +
                        std::to_string(kMinApiMinor) + " and newer minor versions. Install a newer plugin.",
                    0);
  }
  auto init = PJRT_ARGS(PJRT_Plugin_Initialize_Args);
  check(api_->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");
  // The handle stays open for the life of the process: buffers and executables point into it.
  plugin_loaded.store(true);
}

std::shared_ptr<Plugin> Plugin::load(const std::string& path, const std::string& env_var) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Plugin>> loaded;  // dlopen'ed plugins stay for the process
  std::lock_guard<std::mutex> g(mu);
  auto& p = loaded[path];
  if (!p) p = std::make_shared<Plugin>(path, env_var);
  return p;
}

void Plugin::attributes(std::map<std::string, std::vector<int64_t>>* ints,
                        std::map<std::string, std::string>* strings) const {
  auto a = PJRT_ARGS(PJRT_Plugin_Attributes_Args);
  check(api_->PJRT_Plugin_Attributes(&a), "PJRT_Plugin_Attributes");
  read_named_values(a.attributes, a.num_attributes, ints, strings);
}

void Plugin::drop(PJRT_Error* err) const {
  if (!err) return;
  auto destroy = PJRT_ARGS(PJRT_Error_Destroy_Args);
  destroy.error = err;
  api_->PJRT_Error_Destroy(&destroy);
}

void Plugin::check(PJRT_Error* err, const char* what) const {
  if (!err) return;
  auto msg = PJRT_ARGS(PJRT_Error_Message_Args);
  msg.error = err;
  api_->PJRT_Error_Message(&msg);
  std::string text(msg.message, msg.message_size);
  auto code = PJRT_ARGS(PJRT_Error_GetCode_Args);
  code.error = err;
  int c = api_->PJRT_Error_GetCode(&code) == nullptr ? static_cast<int>(code.code) : 2;
  drop(err);
  throw PjrtError(std::string(what) + " failed (PJRT error code " + std::to_string(c) + "): " + text, c);
}

// ---------------------------------------------------------------------------------------------
Buffer::~Buffer() {
  auto a = PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  a.buffer = buf_;
  client_->plugin().drop(client_->plugin().api()->PJRT_Buffer_Destroy(&a));  // never throw from a destructor
}

PJRT_Buffer_Type Buffer::element_type() const {
  auto a = PJRT_ARGS(PJRT_Buffer_ElementType_Args);
  a.buffer = buf_;
  client_->plugin().check(client_->plugin().api()->PJRT_Buffer_ElementType(&a), "PJRT_Buffer_ElementType");
  return a.type;
}

std::vector<int64_t> Buffer::dims() const {
  auto a = PJRT_ARGS(PJRT_Buffer_Dimensions_Args);
  a.buffer = buf_;
  client_->plugin().check(client_->plugin().api()->PJRT_Buffer_Dimensions(&a), "PJRT_Buffer_Dimensions");
  return std::vector<int64_t>(a.dims, a.dims + a.num_dims);
}

size_t Buffer::on_device_size() const { return client_->on_device_size(buf_); }

size_t Client::on_device_size(PJRT_Buffer* buf) const {
  auto a = PJRT_ARGS(PJRT_Buffer_OnDeviceSizeInBytes_Args);
  a.buffer = buf;
  plugin_->check(plugin_->api()->PJRT_Buffer_OnDeviceSizeInBytes(&a), "PJRT_Buffer_OnDeviceSizeInBytes");
  return a.on_device_size_in_bytes;
}

Event::~Event() {
  auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
  d.event = ev_;
  client_->plugin().drop(client_->plugin().api()->PJRT_Event_Destroy(&d));  // never throw from a destructor
}

bool Event::is_ready() const {
  auto a = PJRT_ARGS(PJRT_Event_IsReady_Args);
  a.event = ev_;
  client_->plugin().check(client_->plugin().api()->PJRT_Event_IsReady(&a), "PJRT_Event_IsReady");
  return a.is_ready;
}

void Event::on_ready(std::function<void(const std::string&)> fn) const {
  struct Box {
    const Plugin* plugin;
    std::function<void(const std::string&)> fn;
  };
  auto* box = new Box{&client_->plugin(), std::move(fn)};
  auto a = PJRT_ARGS(PJRT_Event_OnReady_Args);
  a.event = ev_;
  a.user_arg = box;
  a.callback = [](PJRT_Error* err, void* arg) {
    std::unique_ptr<Box> b(static_cast<Box*>(arg));
    std::string msg;
    if (err) {
      try {
        b->plugin->check(err, "device computation");  // takes ownership of err, throws its message
      } catch (const std::exception& e) {
        msg = e.what();
      }
    }
    b->fn(msg);
  };
  PJRT_Error* err = client_->plugin().api()->PJRT_Event_OnReady(&a);
  if (err) {
    delete box;
    client_->plugin().check(err, "PJRT_Event_OnReady");
  }
}

bool Buffer::is_deleted() const {
  auto a = PJRT_ARGS(PJRT_Buffer_IsDeleted_Args);
  a.buffer = buf_;
  client_->plugin().check(client_->plugin().api()->PJRT_Buffer_IsDeleted(&a), "PJRT_Buffer_IsDeleted");
  return a.is_deleted;
}

namespace {
void await_and_destroy(const Plugin& p, PJRT_Event* ev, const char* what) {
  if (!ev) return;
  auto aw = PJRT_ARGS(PJRT_Event_Await_Args);
  aw.event = ev;
  PJRT_Error* err = p.api()->PJRT_Event_Await(&aw);
  auto d = PJRT_ARGS(PJRT_Event_Destroy_Args);
  d.event = ev;
  PJRT_Error* derr = p.api()->PJRT_Event_Destroy(&d);
  p.check(err, what);
  p.check(derr, "PJRT_Event_Destroy");
}
}  // namespace

void Buffer::to_host(void* dst, size_t size) const {
  const Plugin& p = client_->plugin();
  if (client_->platform_name() == "cpu" && size <= on_device_size()) {
    // The CPU plugin's device memory is host memory: once the value is computed, copy it directly.
    // PJRT_Buffer_ToHostBuffer would schedule the copy on the plugin's thread pool and wake this
    // thread when done, a round trip that costs more than the copy for the small reads (.item(),
    // loss values) that training loops make every step.
    await_ready();
    auto inc = PJRT_ARGS(PJRT_Buffer_IncreaseExternalReferenceCount_Args);
    inc.buffer = buf_;
    p.check(p.api()->PJRT_Buffer_IncreaseExternalReferenceCount(&inc), "PJRT_Buffer_IncreaseExternalReferenceCount");
    auto ptr = PJRT_ARGS(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args);
    ptr.buffer = buf_;
    PJRT_Error* err = p.api()->PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&ptr);
    if (!err) std::memcpy(dst, ptr.device_memory_ptr, size);
    auto dec = PJRT_ARGS(PJRT_Buffer_DecreaseExternalReferenceCount_Args);
    dec.buffer = buf_;
    p.drop(p.api()->PJRT_Buffer_DecreaseExternalReferenceCount(&dec));
    if (!err) return;
    p.drop(err);  // no pointer from this plugin build: the transfer below
  }
  auto a = PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  a.src = buf_;
  a.dst = dst;
  a.dst_size = size;
  p.check(p.api()->PJRT_Buffer_ToHostBuffer(&a), "PJRT_Buffer_ToHostBuffer");
  await_and_destroy(p, a.event, "device-to-host transfer");
}

void Buffer::await_ready() const {
  const Plugin& p = client_->plugin();
  auto a = PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  a.buffer = buf_;
  p.check(p.api()->PJRT_Buffer_ReadyEvent(&a), "PJRT_Buffer_ReadyEvent");
  await_and_destroy(p, a.event, "device computation");
}

Executable::~Executable() {
  if (!exe_) return;  // pending: the loaded executable it waited for owns the program
  auto a = PJRT_ARGS(PJRT_LoadedExecutable_Destroy_Args);
  a.executable = exe_;
  client_->plugin().drop(client_->plugin().api()->PJRT_LoadedExecutable_Destroy(&a));  // never throw from a destructor
}

// ---------------------------------------------------------------------------------------------
namespace {

// A value handed to the plugin: it copies it, then frees it with this.
void free_value(char* value) { delete[] value; }

char* hand_out(const std::string& value) {
  char* out = new char[value.size() + 1];
  std::memcpy(out, value.data(), value.size());
  out[value.size()] = '\0';
  return out;
}

PJRT_Error* fail(PJRT_CallbackError* make, PJRT_Error_Code code, const std::string& message) {
  return (*make)(code, message.data(), message.size());
}

PJRT_Error* kv_get(PJRT_KeyValueGetCallback_Args* a) {
  std::string key(a->key, a->key_size);
  try {
    std::string v = static_cast<KeyValueStore*>(a->user_arg)->get(key, a->timeout_in_ms);
    a->value = hand_out(v);
    a->value_size = v.size();
    a->value_deleter_callback = free_value;
    return nullptr;
  } catch (const std::exception& e) {
    return fail(a->callback_error, PJRT_Error_Code_DEADLINE_EXCEEDED,
                "key-value store: no value for '" + key + "' within " + std::to_string(a->timeout_in_ms) +
                    " ms: " + e.what());
  }
}

PJRT_Error* kv_try_get(PJRT_KeyValueTryGetCallback_Args* a) {
  std::string key(a->key, a->key_size);
  try {
    std::optional<std::string> v = static_cast<KeyValueStore*>(a->user_arg)->try_get(key);
    if (!v) return fail(a->callback_error, PJRT_Error_Code_NOT_FOUND, "key-value store: no value for '" + key + "'");
    a->value = hand_out(*v);
    a->value_size = v->size();
    a->value_deleter_callback = free_value;
    return nullptr;
  } catch (const std::exception& e) {
    return fail(a->callback_error, PJRT_Error_Code_UNAVAILABLE, std::string("key-value store: ") + e.what());
  }
}

PJRT_Error* kv_put(PJRT_KeyValuePutCallback_Args* a) {
  try {
    static_cast<KeyValueStore*>(a->user_arg)->put(std::string(a->key, a->key_size),
                                                   std::string(a->value, a->value_size));
    return nullptr;
  } catch (const std::exception& e) {
    return fail(a->callback_error, PJRT_Error_Code_UNAVAILABLE, std::string("key-value store: ") + e.what());
  }
}

}  // namespace

const KeyValueCallbacks& key_value_callbacks() {
  static const KeyValueCallbacks callbacks{kv_get, kv_try_get, kv_put};
  return callbacks;
}

std::shared_ptr<Client> Client::create(std::shared_ptr<Plugin> plugin,
                                       const std::vector<std::pair<std::string, int64_t>>& int_options,
                                       std::shared_ptr<KeyValueStore> kv) {
  std::shared_ptr<Client> c(new Client(std::move(plugin)));
  c->kv_ = std::move(kv);
  const PJRT_Api* api = c->plugin_->api();
  std::vector<PJRT_NamedValue> opts = int_named_values(int_options);
  auto a = PJRT_ARGS(PJRT_Client_Create_Args);
  a.create_options = opts.data();
  a.num_options = opts.size();
  if (c->kv_) {
    void* store = c->kv_.get();
    a.kv_get_callback = kv_get;
    a.kv_get_user_arg = store;
    a.kv_try_get_callback = kv_try_get;
    a.kv_try_get_user_arg = store;
    a.kv_put_callback = kv_put;
    a.kv_put_user_arg = store;
  }
  c->plugin_->check(api->PJRT_Client_Create(&a), "PJRT_Client_Create");
  c->client_ = a.client;

  auto pn = PJRT_ARGS(PJRT_Client_PlatformName_Args);
  pn.client = c->client_;
  c->plugin_->check(api->PJRT_Client_PlatformName(&pn), "PJRT_Client_PlatformName");
  c->platform_name_.assign(pn.platform_name, pn.platform_name_size);
  auto pv = PJRT_ARGS(PJRT_Client_PlatformVersion_Args);
  pv.client = c->client_;
  c->plugin_->check(api->PJRT_Client_PlatformVersion(&pv), "PJRT_Client_PlatformVersion");
  c->platform_version_.assign(pv.platform_version, pv.platform_version_size);

  auto dv = PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  dv.client = c->client_;
  c->plugin_->check(api->PJRT_Client_AddressableDevices(&dv), "PJRT_Client_AddressableDevices");
  c->devices_.assign(dv.addressable_devices, dv.addressable_devices + dv.num_addressable_devices);
  return c;
}

Client::~Client() {
  if (!client_) return;
  auto a = PJRT_ARGS(PJRT_Client_Destroy_Args);
  a.client = client_;
  plugin_->drop(plugin_->api()->PJRT_Client_Destroy(&a));  // never throw from a destructor
}

PJRT_Device* Client::device(int64_t index) const {
  if (index < 0 || index >= static_cast<int64_t>(devices_.size())) {
    throw PjrtError("tpu device index " + std::to_string(index) + " is out of range: the " +
                        platform_name_ + " PJRT plugin has " + std::to_string(devices_.size()) +
                        " device(s) (valid: 0.." + std::to_string(devices_.size() - 1) + ")",
                    3);
  }
  return devices_[index];
}

MemoryStats Client::memory_stats(int64_t index) const {
  MemoryStats s;
  const PJRT_Api* api = plugin_->api();
  auto a = PJRT_ARGS(PJRT_Device_MemoryStats_Args);
  a.device = device(index);
  PJRT_Error* err = api->PJRT_Device_MemoryStats(&a);
  if (err) {  // the CPU plugin does not report memory statistics: say "unknown", not an error
    plugin_->drop(err);
    return s;
  }
  s.bytes_in_use = a.bytes_in_use;
  if (a.peak_bytes_in_use_is_set) s.peak_bytes_in_use = a.peak_bytes_in_use;
  if (a.num_allocs_is_set) s.num_allocs = a.num_allocs;
  if (a.bytes_limit_is_set) s.bytes_limit = a.bytes_limit;
  return s;
}

DeviceDescription Client::describe(int64_t index) const {
  auto g = PJRT_ARGS(PJRT_Device_GetDescription_Args);
  g.device = device(index);
  plugin_->check(plugin_->api()->PJRT_Device_GetDescription(&g), "PJRT_Device_GetDescription");
  return read_description(*plugin_, g.device_description);
}

std::shared_ptr<Executable> Client::compile(const std::string& mlir, const std::string& options) const {
  const PJRT_Api* api = plugin_->api();
  PJRT_Program prog = mlir_program(mlir);
  const std::string& opts = options.empty() ? default_compile_options() : options;
  auto a = PJRT_ARGS(PJRT_Client_Compile_Args);
  a.client = client_;
  a.program = &prog;
  a.compile_options = opts.data();
  a.compile_options_size = opts.size();
  plugin_->check(api->PJRT_Client_Compile(&a), "PJRT_Client_Compile");
  return wrap_loaded(a.executable);
}

std::shared_ptr<Executable> Client::wrap_loaded(PJRT_LoadedExecutable* loaded) const {
  const PJRT_Api* api = plugin_->api();

  // Number of outputs: through the (unloaded) executable.
  auto ge = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  ge.loaded_executable = loaded;
  plugin_->check(api->PJRT_LoadedExecutable_GetExecutable(&ge), "PJRT_LoadedExecutable_GetExecutable");
  auto no = PJRT_ARGS(PJRT_Executable_NumOutputs_Args);
  no.executable = ge.executable;
  PJRT_Error* err = api->PJRT_Executable_NumOutputs(&no);
  auto et = PJRT_ARGS(PJRT_Executable_OutputElementTypes_Args);
  et.executable = ge.executable;
  if (!err) err = api->PJRT_Executable_OutputElementTypes(&et);
  auto od = PJRT_ARGS(PJRT_Executable_OutputDimensions_Args);
  od.executable = ge.executable;
  if (!err) err = api->PJRT_Executable_OutputDimensions(&od);
  int64_t code_bytes = -1;
  if (!err && PJRT_HAS_SLOT(api, PJRT_Executable_SizeOfGeneratedCodeInBytes)) {
    auto cs = PJRT_ARGS(PJRT_Executable_SizeOfGeneratedCodeInBytes_Args);
    cs.executable = ge.executable;
    if (PJRT_Error* e = api->PJRT_Executable_SizeOfGeneratedCodeInBytes(&cs)) {
      plugin_->drop(e);  // not reported: the caches count the program as unknown
    } else {
      code_bytes = cs.size_in_bytes;
    }
  }
  std::vector<PJRT_Buffer_Type> types;
  std::vector<std::vector<int64_t>> dims;
  if (!err) {
    types.assign(et.output_types, et.output_types + et.num_output_types);
    size_t at = 0;
    for (size_t i = 0; i < od.num_outputs; ++i) {
      dims.emplace_back(od.dims + at, od.dims + at + od.dim_sizes[i]);
      at += od.dim_sizes[i];
    }
  }
  auto ed = PJRT_ARGS(PJRT_Executable_Destroy_Args);
  ed.executable = ge.executable;
  api->PJRT_Executable_Destroy(&ed);
  // Owned from here on, so that an error below still destroys it.
  auto exe_owner = std::make_shared<Executable>(
      std::const_pointer_cast<Client>(shared_from_this()), loaded, 0);
  plugin_->check(err, "PJRT_Executable_NumOutputs");
  exe_owner->set_num_outputs(no.num_outputs);
  exe_owner->output_types = std::move(types);
  exe_owner->output_dims = std::move(dims);
  exe_owner->code_bytes = code_bytes;
  return exe_owner;
}

std::string Client::serialize(const Executable& exe) const {
  const PJRT_Api* api = plugin_->api();
  auto ge = PJRT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  ge.loaded_executable = exe.get();
  plugin_->check(api->PJRT_LoadedExecutable_GetExecutable(&ge), "PJRT_LoadedExecutable_GetExecutable");
  auto a = PJRT_ARGS(PJRT_Executable_Serialize_Args);
  a.executable = ge.executable;
  PJRT_Error* err = api->PJRT_Executable_Serialize(&a);
  std::string bytes;
  if (!err) bytes.assign(a.serialized_bytes, a.serialized_bytes_size);
  if (!err && a.serialized_executable_deleter) a.serialized_executable_deleter(a.serialized_executable);
  auto ed = PJRT_ARGS(PJRT_Executable_Destroy_Args);
  ed.executable = ge.executable;
  api->PJRT_Executable_Destroy(&ed);
  plugin_->check(err, "PJRT_Executable_Serialize");
  return bytes;
}

std::shared_ptr<Executable> Client::deserialize(const std::string& bytes) const {
  const PJRT_Api* api = plugin_->api();
  auto a = PJRT_ARGS(PJRT_Executable_DeserializeAndLoad_Args);
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  plugin_->check(api->PJRT_Executable_DeserializeAndLoad(&a), "PJRT_Executable_DeserializeAndLoad");
  return wrap_loaded(a.loaded_executable);
}

std::shared_ptr<Buffer> Client::transfer(const void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims,
                                         int64_t index, PJRT_HostBufferSemantics semantics,
                                         std::function<void()> release) {
  const PJRT_Api* api = plugin_->api();
  auto a = PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  a.client = client_;
  a.data = data;
  a.type = type;
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = semantics;
  a.device = device(index);
  PJRT_Error* err = api->PJRT_Client_BufferFromHostBuffer(&a);
  if (err && release) release();  // the plugin took nothing
  plugin_->check(err, "PJRT_Client_BufferFromHostBuffer");
  auto buf = std::make_shared<Buffer>(shared_from_this(), a.buffer);
  if (!release) {
    // Wait until the host data is no longer needed (already so when copied during the call).
    await_and_destroy(*plugin_, a.done_with_host_buffer, "host-to-device transfer");
  } else if (!a.done_with_host_buffer) {
    release();
  } else {
    // Fires when the plugin no longer reads `data`: when the buffer is gone, or at once if it copied.
    Event done(shared_from_this(), a.done_with_host_buffer);
    done.on_ready([release = std::move(release)](const std::string&) { release(); });
  }
  return buf;
}

std::shared_ptr<Buffer> Client::buffer_aliasing_host(const void* data, PJRT_Buffer_Type type,
                                                     const std::vector<int64_t>& dims, int64_t index,
                                                     std::function<void()> release) {
  return transfer(data, type, dims, index, PJRT_HostBufferSemantics_kImmutableZeroCopy, std::move(release));
}

std::shared_ptr<Buffer> Client::buffer_from_host(const void* data, PJRT_Buffer_Type type,
                                                 const std::vector<int64_t>& dims, int64_t index) {
  return transfer(data, type, dims, index, PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes, {});
}

std::shared_ptr<Buffer> Client::small_buffer_from_host(const void* data, PJRT_Buffer_Type type,
                                                       const std::vector<int64_t>& dims, int64_t index) {
  return transfer(data, type, dims, index, PJRT_HostBufferSemantics_kImmutableOnlyDuringCall, {});
}

std::vector<std::shared_ptr<Buffer>> Client::execute(const Executable& exe,
                                                     const std::vector<PJRT_Buffer*>& args,
                                                     int64_t index,
                                                     const std::vector<int64_t>& non_donatable,
                                                     std::shared_ptr<Event>* done) {
  const PJRT_Api* api = plugin_->api();
  auto opts = PJRT_ARGS(PJRT_ExecuteOptions);
  opts.non_donatable_input_indices = non_donatable.empty() ? nullptr : non_donatable.data();
  opts.num_non_donatable_input_indices = non_donatable.size();
  PJRT_Event* complete = nullptr;
  std::vector<PJRT_Buffer*> outs(exe.num_outputs(), nullptr);
  PJRT_Buffer* const* arg_list = args.data();
  PJRT_Buffer** out_list = outs.data();
  auto a = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  a.executable = exe.get();
  a.options = &opts;
  a.argument_lists = &arg_list;
  a.num_devices = 1;
  a.num_args = args.size();
  a.output_lists = &out_list;
  a.execute_device = device(index);
  a.device_complete_events = done ? &complete : nullptr;
  plugin_->check(api->PJRT_LoadedExecutable_Execute(&a), "PJRT_LoadedExecutable_Execute");
  if (done && complete) *done = std::make_shared<Event>(shared_from_this(), complete);
  std::vector<std::shared_ptr<Buffer>> result;
  result.reserve(outs.size());
  for (PJRT_Buffer* b : outs) result.push_back(std::make_shared<Buffer>(shared_from_this(), b));
  return result;
}

std::vector<std::vector<std::shared_ptr<Buffer>>> Client::execute_replicas(
    const Executable& exe, const std::vector<std::vector<PJRT_Buffer*>>& args, std::vector<std::shared_ptr<Event>>* done) {
  const PJRT_Api* api = plugin_->api();
  const size_t n = args.size();
  auto opts = PJRT_ARGS(PJRT_ExecuteOptions);
  std::vector<PJRT_Buffer* const*> arg_lists(n);
  std::vector<std::vector<PJRT_Buffer*>> outs(n, std::vector<PJRT_Buffer*>(exe.num_outputs(), nullptr));
  std::vector<PJRT_Buffer**> out_lists(n);
  std::vector<PJRT_Event*> complete(n, nullptr);
  for (size_t k = 0; k < n; ++k) {
    if (args[k].size() != args[0].size()) throw PjrtError("execute_replicas: devices given different argument counts", 3);
    arg_lists[k] = args[k].data();
    out_lists[k] = outs[k].data();
  }
  auto a = PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args);
  a.executable = exe.get();
  a.options = &opts;
  a.argument_lists = arg_lists.data();
  a.num_devices = n;
  a.num_args = n ? args[0].size() : 0;
  a.output_lists = out_lists.data();
  a.execute_device = nullptr;  // the executable's own device assignment
  a.device_complete_events = done ? complete.data() : nullptr;
  plugin_->check(api->PJRT_LoadedExecutable_Execute(&a), "PJRT_LoadedExecutable_Execute");
  std::vector<std::vector<std::shared_ptr<Buffer>>> result(n);
  for (size_t k = 0; k < n; ++k) {
    for (PJRT_Buffer* b : outs[k]) result[k].push_back(std::make_shared<Buffer>(shared_from_this(), b));
    if (done) done->push_back(complete[k] ? std::make_shared<Event>(shared_from_this(), complete[k]) : nullptr);
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
std::shared_ptr<Topology> Topology::create(std::shared_ptr<Plugin> plugin, const std::string& name,
                                           const std::vector<std::pair<std::string, int64_t>>& int_options) {
  std::shared_ptr<Topology> t(new Topology(std::move(plugin)));
  const Plugin& p = *t->plugin_;
  const PJRT_Api* api = p.api();
  if (!PJRT_HAS_SLOT(api, PJRT_Compile)) {
    throw PjrtError("PJRT plugin '" + p.path() + "' has no compile-only path (PJRT_Compile)", 12);
  }
  std::vector<PJRT_NamedValue> opts = int_named_values(int_options);
  auto a = PJRT_ARGS(PJRT_TopologyDescription_Create_Args);
  a.topology_name = name.data();
  a.topology_name_size = name.size();
  a.create_options = opts.data();
  a.num_options = opts.size();
  p.check(api->PJRT_TopologyDescription_Create(&a), ("PJRT_TopologyDescription_Create('" + name + "')").c_str());
  t->topology_ = a.topology;
  t->name_ = name;
  auto pn = PJRT_ARGS(PJRT_TopologyDescription_PlatformName_Args);
  pn.topology = t->topology_;
  p.check(api->PJRT_TopologyDescription_PlatformName(&pn), "PJRT_TopologyDescription_PlatformName");
  t->platform_name_.assign(pn.platform_name, pn.platform_name_size);
  auto pv = PJRT_ARGS(PJRT_TopologyDescription_PlatformVersion_Args);
  pv.topology = t->topology_;
  p.check(api->PJRT_TopologyDescription_PlatformVersion(&pv), "PJRT_TopologyDescription_PlatformVersion");
  t->platform_version_.assign(pv.platform_version, pv.platform_version_size);
  return t;
}

Topology::~Topology() {
  if (!topology_) return;
  auto a = PJRT_ARGS(PJRT_TopologyDescription_Destroy_Args);
  a.topology = topology_;
  plugin_->drop(plugin_->api()->PJRT_TopologyDescription_Destroy(&a));  // never throw from a destructor
}

std::vector<DeviceDescription> Topology::devices() const {
  auto a = PJRT_ARGS(PJRT_TopologyDescription_GetDeviceDescriptions_Args);
  a.topology = topology_;
  plugin_->check(plugin_->api()->PJRT_TopologyDescription_GetDeviceDescriptions(&a),
                 "PJRT_TopologyDescription_GetDeviceDescriptions");
  std::vector<DeviceDescription> out;
  out.reserve(a.num_descriptions);
  for (size_t i = 0; i < a.num_descriptions; ++i) out.push_back(read_description(*plugin_, a.descriptions[i]));
  return out;
}

CompiledProgram Topology::compile(const std::string& mlir, const std::string& options) const {
  const Plugin& p = *plugin_;
  const PJRT_Api* api = p.api();
  const std::string& opts = options.empty() ? default_compile_options() : options;
  PJRT_Program prog = mlir_program(mlir);
  auto a = PJRT_ARGS(PJRT_Compile_Args);
  a.topology = topology_;
  a.program = &prog;
  a.compile_options = opts.data();
  a.compile_options_size = opts.size();
  a.client = nullptr;  // compile-only: no chip
  p.check(api->PJRT_Compile(&a), "PJRT_Compile");
  // Owned from here on: destroyed on every path out.
  std::unique_ptr<PJRT_Executable, std::function<void(PJRT_Executable*)>> exe(a.executable, [&p](PJRT_Executable* e) {
    auto d = PJRT_ARGS(PJRT_Executable_Destroy_Args);
    d.executable = e;
    p.drop(p.api()->PJRT_Executable_Destroy(&d));
  });
  CompiledProgram out;
  auto no = PJRT_ARGS(PJRT_Executable_NumOutputs_Args);
  no.executable = exe.get();
  p.check(api->PJRT_Executable_NumOutputs(&no), "PJRT_Executable_NumOutputs");
  out.num_outputs = no.num_outputs;
  auto ca = PJRT_ARGS(PJRT_Executable_GetCostAnalysis_Args);
  ca.executable = exe.get();
  if (PJRT_Error* err = api->PJRT_Executable_GetCostAnalysis(&ca)) {
    p.drop(err);  // a plugin without a cost model: no figures
  } else {
    for (size_t i = 0; i < ca.num_properties; ++i) {
      const PJRT_NamedValue& v = ca.properties[i];
      std::string name(v.name, v.name_size);
      if (v.type == PJRT_NamedValue_kFloat) out.cost[name] = v.float_value;
      else if (v.type == PJRT_NamedValue_kInt64) out.cost[name] = static_cast<double>(v.int64_value);
    }
  }
  if (PJRT_HAS_SLOT(api, PJRT_Executable_GetCompiledMemoryStats)) {
    auto ms = PJRT_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args);
    ms.executable = exe.get();
    if (PJRT_Error* err = api->PJRT_Executable_GetCompiledMemoryStats(&ms)) {
      p.drop(err);
    } else {
      out.code_bytes = ms.generated_code_size_in_bytes;
      out.argument_bytes = ms.argument_size_in_bytes;
      out.output_bytes = ms.output_size_in_bytes;
      out.alias_bytes = ms.alias_size_in_bytes;
      out.temp_bytes = ms.temp_size_in_bytes;
      out.peak_bytes = ms.peak_memory_in_bytes > 0 ? ms.peak_memory_in_bytes : -1;
    }
  }
  auto se = PJRT_ARGS(PJRT_Executable_Serialize_Args);
  se.executable = exe.get();
  p.check(api->PJRT_Executable_Serialize(&se), "PJRT_Executable_Serialize");
  out.serialized.assign(se.serialized_bytes, se.serialized_bytes_size);
  if (se.serialized_executable_deleter) se.serialized_executable_deleter(se.serialized_executable);
  return out;
}

}  // namespace torch_tpu::pjrt
