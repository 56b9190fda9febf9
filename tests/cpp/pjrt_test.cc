// GoogleTest of the PJRT layer alone (csrc/pjrt), against a real plugin given as argv / env
// TORCH_TPU_TEST_PLUGIN: loading errors, compile + execute, error propagation, devices.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "pjrt/pjrt.h"

using torch_tpu::pjrt::Client;
using torch_tpu::pjrt::Plugin;
using torch_tpu::pjrt::PjrtError;

namespace {

std::string plugin_path() {
  const char* p = std::getenv("TORCH_TPU_TEST_PLUGIN");
  return p ? p : "";
}

std::shared_ptr<Client> client() {
  static std::shared_ptr<Client> c =
      Client::create(std::make_shared<Plugin>(plugin_path(), "TORCH_TPU_TEST_PLUGIN"), {});
  return c;
}

const char* kAdd = R"(module @m {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.add"(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }
})";

TEST(Plugin, MissingFileNamesPathAndVariable) {
  try {
    Plugin p("/nonexistent/plugin.so", "TORCH_TPU_PJRT_PLUGIN");
    FAIL() << "expected an error";
  } catch (const PjrtError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("/nonexistent/plugin.so"), std::string::npos) << m;
    EXPECT_NE(m.find("TORCH_TPU_PJRT_PLUGIN"), std::string::npos) << m;
  }
}

TEST(Plugin, NotAPlugin) {
  std::string path = ::testing::TempDir() + "not_a_plugin.so";
  std::ofstream(path) << "not an ELF file";
  EXPECT_THROW(Plugin(path, "TORCH_TPU_PJRT_PLUGIN"), PjrtError);
}

TEST(Plugin, ReportsSupportedVersion) {
  Plugin p(plugin_path(), "TORCH_TPU_TEST_PLUGIN");
  EXPECT_EQ(p.api_major(), 0);
  EXPECT_GE(p.api_minor(), torch_tpu::pjrt::kMinApiMinor);
}

TEST(Client, CompileAndExecuteOnEveryDevice) {
  auto c = client();
  ASSERT_GE(c->device_count(), 1u);
  auto exe = c->compile(kAdd);
  ASSERT_EQ(exe->num_outputs(), 1u);
  ASSERT_EQ(exe->output_types.at(0), PJRT_Buffer_Type_F32);
  ASSERT_EQ(exe->output_dims.at(0), std::vector<int64_t>{4});
  float x[4] = {1, 2, 3, 4}, y[4] = {10, 20, 30, 40};
  for (size_t d = 0; d < c->device_count(); ++d) {
    auto bx = c->buffer_from_host(x, PJRT_Buffer_Type_F32, {4}, d);
    auto by = c->buffer_from_host(y, PJRT_Buffer_Type_F32, {4}, d);
    auto out = c->execute(*exe, {bx->get(), by->get()}, d);
    float z[4];
    out.at(0)->to_host(z, sizeof z);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(z[i], x[i] + y[i]);
  }
}

TEST(Client, CompileErrorCarriesPluginMessage) {
  try {
    client()->compile("module { this is not stablehlo }");
    FAIL() << "expected an error";
  } catch (const PjrtError& e) {
    EXPECT_NE(std::string(e.what()).find("PJRT_Client_Compile"), std::string::npos);
    EXPECT_NE(e.code(), 0);
  }
}

TEST(Client, SerializedExecutableRunsAfterLoading) {
  auto c = client();
  std::string bytes = c->serialize(*c->compile(kAdd));
  ASSERT_FALSE(bytes.empty());
  auto exe = c->deserialize(bytes);
  ASSERT_EQ(exe->num_outputs(), 1u);
  float x[4] = {1, 2, 3, 4}, z[4];
  auto bx = c->buffer_from_host(x, PJRT_Buffer_Type_F32, {4}, 0);
  auto out = c->execute(*exe, {bx->get(), bx->get()}, 0);
  out.at(0)->to_host(z, sizeof z);
  EXPECT_EQ(z[3], 8.0f);
  EXPECT_THROW(c->deserialize("garbage bytes"), PjrtError);
}

TEST(Client, BadDeviceIndex) {
  float x = 1;
  EXPECT_THROW(client()->buffer_from_host(&x, PJRT_Buffer_Type_F32, {}, 1000), PjrtError);
}

}  // namespace

namespace {

// A KeyValueStore in memory; `get` fails at once on a missing key (no other process to wait for).
class MapStore : public torch_tpu::pjrt::KeyValueStore {
 public:
  std::map<std::string, std::string> values;
  std::string get(const std::string& key, int) override {
    auto it = values.find(key);
    if (it == values.end()) throw std::runtime_error("timed out");
    return it->second;
  }
  std::optional<std::string> try_get(const std::string& key) override {
    auto it = values.find(key);
    if (it == values.end()) return std::nullopt;
    return it->second;
  }
  void put(const std::string& key, const std::string& value) override { values[key] = value; }
};

// Stands in for the plugin's error constructor: remembers the code and message, returns a token.
PJRT_Error_Code last_code;
std::string last_message;
PJRT_Error* record_error(PJRT_Error_Code code, const char* message, size_t size) {
  last_code = code;
  last_message.assign(message, size);
  return reinterpret_cast<PJRT_Error*>(&last_code);
}
PJRT_CallbackError kRecord = record_error;

}  // namespace

TEST(KeyValueCallbacks, PutGetTryGetAsAPluginCallsThem) {
  MapStore store;
  const auto& cb = torch_tpu::pjrt::key_value_callbacks();
  const std::string value("a\0b", 3);  // values are bytes, zeros included
  auto put = PJRT_KeyValuePutCallback_Args{PJRT_KeyValuePutCallback_Args_STRUCT_SIZE};
  put.key = "k", put.key_size = 1, put.value = value.data(), put.value_size = value.size();
  put.callback_error = &kRecord, put.user_arg = &store;
  ASSERT_EQ(cb.put(&put), nullptr);
  EXPECT_EQ(store.values.at("k"), value);

  auto get = PJRT_KeyValueGetCallback_Args{PJRT_KeyValueGetCallback_Args_STRUCT_SIZE};
  get.key = "k", get.key_size = 1, get.timeout_in_ms = 10, get.callback_error = &kRecord, get.user_arg = &store;
  ASSERT_EQ(cb.get(&get), nullptr);
  EXPECT_EQ(std::string(get.value, get.value_size), value);
  ASSERT_NE(get.value_deleter_callback, nullptr);
  get.value_deleter_callback(get.value);

  get.key = "missing", get.key_size = 7;
  EXPECT_NE(cb.get(&get), nullptr);
  EXPECT_EQ(last_code, PJRT_Error_Code_DEADLINE_EXCEEDED);
  EXPECT_NE(last_message.find("no value for 'missing' within 10 ms"), std::string::npos) << last_message;

  auto tryget = PJRT_KeyValueTryGetCallback_Args{PJRT_KeyValueTryGetCallback_Args_STRUCT_SIZE};
  tryget.key = "missing", tryget.key_size = 7, tryget.callback_error = &kRecord, tryget.user_arg = &store;
  EXPECT_NE(cb.try_get(&tryget), nullptr);
  EXPECT_EQ(last_code, PJRT_Error_Code_NOT_FOUND);
  tryget.key = "k", tryget.key_size = 1;
  ASSERT_EQ(cb.try_get(&tryget), nullptr);
  EXPECT_EQ(std::string(tryget.value, tryget.value_size), value);
  tryget.value_deleter_callback(tryget.value);
}

TEST(KeyValueCallbacks, ClientKeepsItsStore) {
  // The CPU plugin ignores the callbacks; the client still holds the store for its lifetime.
  auto store = std::make_shared<MapStore>();
  auto c = Client::create(std::make_shared<Plugin>(plugin_path(), "TORCH_TPU_TEST_PLUGIN"), {}, store);
  EXPECT_EQ(c->key_value_store(), store);
  EXPECT_GE(c->device_count(), 1u);
}

TEST(CompileOptions, OneReplicaPerDevice) {
  using torch_tpu::pjrt::replica_compile_options;
  EXPECT_EQ(replica_compile_options({0}), torch_tpu::pjrt::default_compile_options());
  // CompileOptionsProto{executable_build_options{num_replicas 2, num_partitions 1,
  //   device_assignment{replica_count 2, computation_count 1, computation_devices{[0, 100001]}}}}
  const unsigned char want[] = {0x1A, 0x12, 0x20, 0x02, 0x28, 0x01, 0x4A, 0x0C, 0x08, 0x02, 0x10, 0x01,
                                0x1A, 0x06, 0x0A, 0x04, 0x00, 0xA1, 0x8D, 0x06};
  EXPECT_EQ(replica_compile_options({0, 100001}), std::string(reinterpret_cast<const char*>(want), sizeof want));
}
