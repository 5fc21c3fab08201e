#include "tests/integration/ops_harness.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
// Boost.JSON, header-only: compiled here once for the whole test binary.
#include <boost/json/src.hpp>

#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

extern char** environ;

namespace kvtier::integration {

ProcessResult run_as(uid_t uid, gid_t gid, const std::vector<std::string>& argv) {
  ProcessResult result;
  UniqueFd out(::memfd_create("stdout", 0));
  UniqueFd err(::memfd_create("stderr", 0));
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t child = fork_child([&] {
    if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) return 96;
    ::dup2(out.get(), STDOUT_FILENO);
    ::dup2(err.get(), STDERR_FILENO);
    ::execve(args[0], args.data(), environ);
    return 97;
  });
  result.status = wait_for_exit(child);
  result.stdout_text = read_all(out.get());
  result.stderr_text = read_all(err.get());
  return result;
}

Result<std::string> metrics_address(const Daemon& daemon) {
  static const std::regex kLine(R"(metrics at http://([0-9.:\[\]a-f]+)/metrics)");
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (true) {
    const std::string log = daemon.log();
    std::smatch match;
    if (std::regex_search(log, match, kLine)) return match[1].str();
    if (std::chrono::steady_clock::now() >= deadline) {
      return internal_error("kvtierd never logged its metrics address; its log:\n{}", log);
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

Result<std::string> http_get(const std::string& address, const std::string& path) {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  try {
    asio::io_context io;
    asio::ip::tcp::socket socket(io);
    const auto colon = address.rfind(':');
    socket.connect({asio::ip::make_address(address.substr(0, colon)),
                    static_cast<unsigned short>(std::stoi(address.substr(colon + 1)))});
    http::request<http::empty_body> request{http::verb::get, path, 11};
    request.set(http::field::host, address);
    request.keep_alive(false);
    http::write(socket, request);
    boost::beast::flat_buffer buffer;
    http::response<http::string_body> response;
    http::read(socket, buffer, response);
    if (response.result() != http::status::ok) {
      return internal_error("GET {}{}: HTTP {}", address, path, response.result_int());
    }
    return response.body();
  } catch (const std::exception& e) {
    return unavailable("GET {}{}: {}", address, path, e.what());
  }
}

std::optional<double> metric(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return std::nullopt;
}

Result<boost::json::value> parse_json(const std::string& text) {
  boost::system::error_code ec;
  boost::json::value value = boost::json::parse(text, ec);
  if (ec) return invalid_argument("not JSON ({}): {}", ec.message(), text);
  return value;
}

Result<std::vector<boost::json::value>> parse_json_lines(const std::string& text) {
  std::vector<boost::json::value> values;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    auto value = parse_json(line);
    if (!value.is_ok()) return value.status();
    values.push_back(std::move(*value));
  }
  return values;
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return internal_error("cannot write {}", path);
  return Status::ok();
}

}  // namespace kvtier::integration
