// GoogleTest of the PJRT layer alone (csrc/pjrt), against a real plugin given as argv / env
// TORCH_TPU_TEST_PLUGIN: loading errors, compile + execute, error propagation, devices.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

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
