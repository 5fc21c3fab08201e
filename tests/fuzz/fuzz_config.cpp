// The TOML configuration (daemon/config.h) from any text: a refusal names the source
// and says what is wrong (a key, or that the text is not TOML); an accepted file gives
// a configuration whose rendering (what --check-config prints) reads back to the same
// configuration.
#include <string>
#include <string_view>

#include "daemon/config.h"
#include "tests/fuzz/fuzz_check.h"

using namespace kvtier;
using namespace kvtier::daemon;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  DaemonConfig config = default_config();
  Status applied = apply_config_text(text, "fuzz.toml", config);
  if (!applied.is_ok()) {
    KVTIER_FUZZ_CHECK(applied.code() == StatusCode::kInvalidArgument, "%s",
                      applied.to_string().c_str());
    KVTIER_FUZZ_CHECK(applied.message().rfind("fuzz.toml", 0) == 0, "%s",
                      applied.message().c_str());
    return 0;
  }
  (void)validate(config);  // a combination may be refused; it must not crash
  const std::string rendered = to_toml(config);
  DaemonConfig again = default_config();
  Status reread = apply_config_text(rendered, "rendered.toml", again);
  KVTIER_FUZZ_CHECK(reread.is_ok(), "the rendering of an accepted file is refused: %s\n%s",
                    reread.message().c_str(), rendered.c_str());
  KVTIER_FUZZ_CHECK(changed_keys(config, again).empty(), "reading the rendering back changes %s",
                    changed_keys(config, again).front().c_str());
  KVTIER_FUZZ_CHECK(to_toml(again) == rendered, "the rendering is not stable");
  return 0;
}
