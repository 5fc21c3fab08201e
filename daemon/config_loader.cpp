// Reading settings from a TOML file (toml++) and from flags (CLI11). Both feed every
// value through the setting's own text parser, so a size means the same thing in the
// file and on the command line, and every error names the key it came from.
#include <toml++/toml.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "daemon/config.h"

#ifndef KVTIER_VERSION
#define KVTIER_VERSION "unknown"
#endif

namespace kvtier::daemon {
namespace {

using Kind = Setting::Kind;

std::string_view type_name(toml::node_type type) {
  switch (type) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date or time";
  }
}

std::string_view expected(Kind kind) {
  switch (kind) {
    case Kind::kSize:
      return "a size such as \"4GiB\" or an integer number of bytes";
    case Kind::kDuration:
      return "a duration such as \"30s\" or an integer number of milliseconds";
    case Kind::kNumber:
      return "a number";
    case Kind::kInteger:
      return "an integer";
    case Kind::kText:
      return "a string";
    case Kind::kTextList:
      return "an array of strings";
  }
  return "a value";
}

// The node as the text its flag would carry; one entry per element for lists.
Result<std::vector<std::string>> node_texts(const Setting& setting, const toml::node& node) {
  const auto type = node.type();
  auto wrong_type = [&]() -> Status {
    return invalid_argument("expected {}, found {}", expected(setting.kind), type_name(type));
  };
  switch (setting.kind) {
    case Kind::kSize:
    case Kind::kDuration:
      if (auto* text = node.as_string()) return std::vector<std::string>{text->get()};
      if (auto* number = node.as_integer(); number != nullptr && number->get() >= 0)
        return std::vector<std::string>{std::to_string(number->get())};
      return wrong_type();
    case Kind::kNumber:
      if (auto* number = node.as_floating_point())
        return std::vector<std::string>{fmt::format("{}", number->get())};
      [[fallthrough]];
    case Kind::kInteger:
      if (auto* number = node.as_integer())
        return std::vector<std::string>{std::to_string(number->get())};
      return wrong_type();
    case Kind::kText:
      if (auto* text = node.as_string()) return std::vector<std::string>{text->get()};
      return wrong_type();
    case Kind::kTextList: {
      if (auto* text = node.as_string()) return std::vector<std::string>{text->get()};
      auto* array = node.as_array();
      if (array == nullptr) return wrong_type();
      std::vector<std::string> texts;
      for (size_t i = 0; i < array->size(); ++i) {
        auto* text = array->get(i)->as_string();
        if (text == nullptr) {
          return invalid_argument("element {} is {}; expected a string", i,
                                  type_name(array->get(i)->type()));
        }
        texts.push_back(text->get());
      }
      return texts;
    }
  }
  return wrong_type();
}

std::string value_name(Kind kind) {
  switch (kind) {
    case Kind::kSize:
      return "SIZE";
    case Kind::kDuration:
      return "DURATION";
    case Kind::kNumber:
      return "FRACTION";
    case Kind::kInteger:
      return "N";
    case Kind::kText:
      return "TEXT";
    case Kind::kTextList:
      return "SPEC";
  }
  return "VALUE";
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string suggestion(std::string_view key) {
  const Setting* best = nullptr;
  size_t best_distance = 4;
  for (const Setting& setting : settings()) {
    size_t distance = edit_distance(key, setting.key);
    if (distance < best_distance) {
      best = &setting;
      best_distance = distance;
    }
  }
  return best ? fmt::format(" (did you mean '{}'?)", best->key) : " (kvtierd --help lists keys)";
}

// Applies texts to one setting: lists are replaced as a whole.
Status apply_texts(const Setting& setting, const std::vector<std::string>& texts,
                   DaemonConfig& config) {
  if (setting.clear) setting.clear(config);
  for (const std::string& text : texts) KVTIER_RETURN_IF_ERROR(setting.set(config, text));
  return Status::ok();
}

std::string help_footer() {
  std::string live;
  for (const Setting& setting : settings()) {
    if (setting.reloadable) live += (live.empty() ? "" : ", ") + std::string(setting.key);
  }
  return fmt::format(
      "\nEvery flag is also a key of the --config TOML file (e.g. hbm-bytes = \"8GiB\");\n"
      "flags override the file. Sizes take B, KiB, MiB, GiB, TiB; durations ms, s, m, h.\n"
      "SIGHUP re-reads the file and flags and applies: {}.\n",
      live);
}

}  // namespace

Status apply_config_file(const std::string& path, DaemonConfig& config) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return invalid_argument("--config {}: cannot read it: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return invalid_argument("--config {}: cannot read it", path);
  return apply_config_text(text.str(), path, config);
}

Status apply_config_text(std::string_view text, const std::string& path, DaemonConfig& config) {
  toml::table table;
  try {
    table = toml::parse(text, path);
  } catch (const toml::parse_error& error) {
    const auto& where = error.source().begin;
    if (where.line == 0) return invalid_argument("{}: {}", path, error.description());
    return invalid_argument("{}:{}: {}", path, where.line, error.description());
  }
  for (auto&& [key, node] : table) {
    const auto line = key.source().begin.line;
    const Setting* setting = find_setting(key.str());
    if (setting == nullptr) {
      return invalid_argument("{}:{}: unknown key '{}'{}", path, line, key.str(),
                              suggestion(key.str()));
    }
    auto texts = node_texts(*setting, node);
    Status applied = texts.is_ok() ? apply_texts(*setting, *texts, config) : texts.status();
    if (!applied.is_ok()) {
      return invalid_argument("{}:{}: {}: {}", path, line, key.str(), applied.message());
    }
  }
  return Status::ok();
}

Result<CommandLine> parse_command_line(int argc, const char* const* argv) {
  CommandLine out;
  out.config = default_config();
  CLI::App app{"kvtierd: keeps LLM KV caches alive between the turns of a conversation"};
  app.footer(help_footer());
  app.set_version_flag("--version", "kvtierd " KVTIER_VERSION);
  app.add_option("--config", out.config_file, "read settings from this TOML file")
      ->type_name("FILE");
  app.add_flag("--check-config", out.check_config,
               "validate the file and flags, print the effective configuration, and exit");
  struct FlagValue {
    const Setting* setting;
    CLI::Option* option;
    std::vector<std::string> texts;
    std::string text;
  };
  std::vector<FlagValue> flags(settings().size());
  for (size_t i = 0; i < settings().size(); ++i) {
    const Setting& setting = settings()[i];
    FlagValue& flag = flags[i];
    flag.setting = &setting;
    const std::string name = "--" + std::string(setting.key);
    const std::string help(setting.help);
    flag.option = setting.kind == Kind::kTextList ? app.add_option(name, flag.texts, help)
                                                  : app.add_option(name, flag.text, help);
    flag.option->type_name(value_name(setting.kind));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return Status(StatusCode::kNotFound, "");
  } catch (const CLI::CallForVersion&) {
    std::printf("kvtierd %s\n", KVTIER_VERSION);
    return Status(StatusCode::kNotFound, "");
  } catch (const CLI::ParseError& e) {
    return invalid_argument("{}", e.what());
  }

  if (!out.config_file.empty()) {
    KVTIER_RETURN_IF_ERROR(apply_config_file(out.config_file, out.config));
  }
  for (const FlagValue& flag : flags) {
    if (flag.option->count() == 0) continue;
    std::vector<std::string> texts =
        flag.setting->kind == Kind::kTextList ? flag.texts : std::vector<std::string>{flag.text};
    Status applied = apply_texts(*flag.setting, texts, out.config);
    if (!applied.is_ok()) {
      return invalid_argument("--{}: {}", flag.setting->key, applied.message());
    }
  }
  KVTIER_RETURN_IF_ERROR(resolve_names(out.config));
  KVTIER_RETURN_IF_ERROR(validate(out.config));
  return out;
}

}  // namespace kvtier::daemon
