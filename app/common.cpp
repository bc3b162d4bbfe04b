#include "commands.hpp"

#include "kvasir/audit/audit.hpp"
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/report/writers.hpp"

#include <fmt/format.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>
#include <system_error>

namespace kvasir::app {

std::string default_model_path() { return std::string(KVASIR_SOURCE_DIR) + "/fixtures/models/qwen3_moe_tiny"; }

std::string default_protocol_path(bool model_given) {
    return std::string(KVASIR_SOURCE_DIR) + (model_given ? "/protocols/default.json" : "/protocols/trained.json");
}

void add_perplexity_flags(CLI::App& cmd, PerplexityFlags& f, const std::string& applies_to) {
    cmd.add_option("--score", f.score,
                   "Which predictions count: all (the default), or second-half as llama-perplexity scores, from position "
                   "C/2 of each window of C tokens" + applies_to)
        ->check(CLI::IsMember({"all", "second-half"}));
    cmd.add_flag("--kl-divergence{exact}", f.kl_divergence,
                 "Add llama-perplexity --kl-divergence's statistics of each node against the reference (KLD, Δp, same "
                 "top); alone it is =exact, =llamacpp-u16 rounds the reference's log-probabilities as llama.cpp's base "
                 "file does" + applies_to)
        ->check(CLI::IsMember({"exact", "llamacpp-u16"}));
}

PerplexityOverrides perplexity_overrides(const PerplexityFlags& f) {
    PerplexityOverrides o;
    if (!f.score.empty()) o.second_half = f.score == "second-half";
    if (!f.kl_divergence.empty()) o.kl_divergence = f.kl_divergence;
    return o;
}

Protocol load_run_protocol(const std::string& path, bool model_given, const PerplexityFlags& f) {
    return with_perplexity_overrides(load_protocol(path.empty() ? default_protocol_path(model_given) : path),
                                     perplexity_overrides(f));
}

std::string shipped_protocol_with_hash(const std::string& hash, const std::string& described_as,
                                       const PerplexityFlags& flags) {
    const std::filesystem::path dir = std::filesystem::path(KVASIR_SOURCE_DIR) / "protocols";
    std::vector<std::filesystem::path> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (e.path().extension() == ".json" && e.path().filename().string().find("schema") == std::string::npos)
            files.push_back(e.path());
    std::sort(files.begin(), files.end());
    const PerplexityOverrides over = perplexity_overrides(flags);
    for (const auto& f : files) {
        const Protocol p = load_protocol(f.string());
        if (over.any() && !p.perplexity.enabled) continue;
        if (with_perplexity_overrides(p, over).content_hash == hash) return f.string();
    }
    ::kvasir::fail(ErrorCode::bad_input, "{} was made with protocol hash {}, which no protocol shipped in {} has{}: pass it with -p FILE{}",
                described_as, hash, dir.string(), over.any() ? " with these --score/--kl-divergence options" : "",
                over.any() ? "" : " (a capture made with --score or --kl-divergence needs the same options here)");
}

HtmlStamp html_stamp() {
    HtmlStamp s;
    std::time_t t = std::time(nullptr);
    if (const char* e = std::getenv("SOURCE_DATE_EPOCH"); e != nullptr && *e != '\0') {
        char* end = nullptr;
        const long long v = std::strtoll(e, &end, 10);
        if (*end == '\0' && v >= 0) t = static_cast<std::time_t>(v);
    }
    std::tm utc{};
    if (::gmtime_r(&t, &utc) != nullptr) {
        char buf[64];
        if (std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &utc) > 0) s.date = buf;
    }
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) s.machine = host;
    struct utsname u {};
    if (::uname(&u) == 0) s.machine += fmt::format("{}({} {} {})", s.machine.empty() ? "" : " ", u.sysname, u.release, u.machine);
    return s;
}

namespace {

enum class NumberKind { none, signed_integer, unsigned_integer, floating };

NumberKind number_kind(const CLI::Option& o) {
    const std::string t = o.get_type_name();
    const std::string base = t.substr(0, t.find(':'));
    if (base == "INT") return NumberKind::signed_integer;
    if (base == "UINT") return NumberKind::unsigned_integer;
    if (base == "FLOAT") return NumberKind::floating;
    return NumberKind::none;
}

bool is_text(const CLI::Option& o) {
    const std::string t = o.get_type_name();
    return t.substr(0, t.find(':')) == "TEXT";
}

// The error text for `text` as a number of `kind` ("" when it is one).
std::string number_error(NumberKind kind, const std::string& text) {
    const char* b = text.data();
    const char* e = b + text.size();
    if (kind == NumberKind::floating) {
        double v = 0;
        const auto [end, ec] = std::from_chars(b, e, v, std::chars_format::general);
        if (text.empty() || end != e || ec == std::errc::invalid_argument || std::isnan(v) || std::isinf(v))
            return ec == std::errc::result_out_of_range ? fmt::format("'{}' is outside the range of a double", text)
                                                        : fmt::format("'{}' is not a finite decimal number", text);
        if (ec == std::errc::result_out_of_range) return fmt::format("'{}' is outside the range of a double", text);
        return {};
    }
    const bool is_signed = kind == NumberKind::signed_integer;
    const bool digits = !text.empty() && text.find_first_not_of("0123456789", is_signed && text[0] == '-' ? 1 : 0) == std::string::npos &&
                        text != "-";
    const std::string range = is_signed ? fmt::format("{}..{}", std::numeric_limits<std::int64_t>::min(),
                                                      std::numeric_limits<std::int64_t>::max())
                                        : fmt::format("0..{}", std::numeric_limits<std::uint64_t>::max());
    if (!digits)
        return fmt::format("'{}' is not {} integer ({})", text, is_signed ? "a decimal" : "an unsigned decimal", range);
    std::from_chars_result r{};
    if (is_signed) {
        std::int64_t v = 0;
        r = std::from_chars(b, e, v);
    } else {
        std::uint64_t v = 0;
        r = std::from_chars(b, e, v);
    }
    if (r.ec != std::errc{} || r.ptr != e) return fmt::format("'{}' is outside {}", text, range);
    return {};
}

}  // namespace

void strict_options(CLI::App& app) {
    for (CLI::Option* o : app.get_options()) {
        if (o->nonpositional() && o->get_items_expected_max() > 1) o->allow_extra_args(false);
        if (is_text(*o))
            o->check(CLI::Validator([](std::string& text) { return text.empty() ? std::string("an empty value") : std::string(); },
                                    "", "non-empty"));
        const NumberKind kind = number_kind(*o);
        if (kind == NumberKind::none) continue;
        o->check(CLI::Validator([kind](std::string& text) { return number_error(kind, text); }, "", "strict number"));
    }
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) strict_options(*sub);
}

namespace {

bool non_finite_value(const nlohmann::ordered_json& v) {
    if (v.is_number_float()) return !std::isfinite(v.get<double>());
    if (!v.is_string()) return false;
    const std::string& s = v.get_ref<const std::string&>();
    return s == "nan" || s == "-nan" || s == "inf" || s == "-inf" || s == "Infinity" || s == "-Infinity" || s == "NaN";
}

// Walks `v`, attributing each value to the nearest enclosing "node" or
// "candidate"; a pair whose "reference" is not the report's reference
// (candidate against candidate) is not judged.
void scan_non_finite(const nlohmann::ordered_json& v, const std::string& path, std::string node, const std::string& reference,
                     std::map<std::string, std::string>& first, std::map<std::string, std::string>& errors,
                     std::string& reference_bad, bool in_pair = false) {
    if (v.is_object()) {
        const auto r = v.find("reference");
        const bool pair = r != v.end() && r->is_string();
        if (pair && *r != reference) return;
        if (const auto c = v.find("candidate"); c != v.end() && c->is_string()) node = c->get<std::string>();
        else if (const auto n = v.find("node"); n != v.end() && n->is_string()) node = n->get<std::string>();
        // A node whose step failed (generate: "only NaN logits", a fault) is that node's error.
        if (const auto e = v.find("error"); e != v.end() && e->is_string() && !e->get_ref<const std::string&>().empty() &&
                                            !node.empty() && node != reference && errors.count(node) == 0)
            errors[node] = e->get<std::string>();
        for (auto it = v.begin(); it != v.end(); ++it) {
            // NaN written for "there is none": no divergence (no margin at it), no
            // power-law fit (fewer than 2 layers with a drift above 0 — a node
            // bit-identical to the reference).
            if (it.key() == "ref_margin_at_divergence" || it.key() == "cand_margin_at_divergence" || it.key() == "fit") continue;
            scan_non_finite(*it, path + "/" + it.key(), node, reference, first, errors, reference_bad, pair || in_pair);
        }
    } else if (v.is_array()) {
        for (std::size_t i = 0; i < v.size(); ++i)
            scan_non_finite(v[i], fmt::format("{}/{}", path, i), node, reference, first, errors, reference_bad, in_pair);
    } else if (in_pair && (path.ends_with("/nan_ref") || path.ends_with("/inf_ref")) && v.is_number() && v.get<double>() > 0) {
        // A pair's count of NaN/Inf on the reference's side: the yardstick itself.
        if (reference_bad.empty()) reference_bad = path;
    } else if (non_finite_value(v) && !node.empty() && node != reference && first.count(node) == 0) {
        first[node] = path;
    }
}

}  // namespace

void judge_non_finite(const nlohmann::ordered_json& report, const std::string& step, const Model* model) {
    const std::string reference = report.value("reference", "");
    std::map<std::string, std::string> first, errors;
    std::string reference_bad;
    for (auto it = report.begin(); it != report.end(); ++it) {
        if (it.key() == "config" || it.key() == "tool" || it.key() == "nodes" || it.key() == "schema") continue;
        scan_non_finite(*it, "/" + it.key(), "", reference, first, errors, reference_bad);
    }
    for (const auto& [node, why] : errors) {
        std::fprintf(stderr, "kvasir-equiv: %s: error in %s: %s\n", node.c_str(), step.c_str(), why.c_str());
        command_exit_code() = std::max(command_exit_code(), 1);
    }
    for (const auto& [node, why] : errors) first.erase(node);  // its figures are absent, not non-finite
    if (first.empty() && reference_bad.empty()) return;
    if (model != nullptr)
        if (const auto w = detail::first_non_finite_weight(*model))
            fail(ErrorCode::bad_input, "{}: the model is not finite: {}; no node is judged against a broken model — fix the checkpoint",
                 model->path(), *w);
    KVASIR_CHECK(reference_bad.empty(), ErrorCode::bad_input,
                 "the reference {} computed non-finite values from finite inputs in {} ({}); it cannot be the yardstick "
                 "(name another node with --reference)", reference, step, reference_bad);
    for (const auto& [node, path] : first)
        std::fprintf(stderr, "kvasir-equiv: %s: non-finite results in %s (first at %s): not comparable, unfit\n", node.c_str(),
                     step.c_str(), path.c_str());  // path may carry the node's error text
    command_exit_code() = std::max(command_exit_code(), 1);
}

int& command_exit_code() {
    static int code = 0;
    return code;
}

void add_output_options(CLI::App& cmd, OutputOptions& out) {
    cmd.add_flag("--json", out.json, "Print the report as JSON on stdout instead of tables");
    cmd.add_option("-o,--output", out.output_file, "Also write the JSON report to FILE (atomically)");
}

void add_node_options(CLI::App& cmd, NodeOptions& nodes) {
    cmd.add_option("-b,--backends", nodes.backends,
                   "Nodes to run, comma separated: NAME[:DEVICE][:key=value,...], e.g. cpu-ref,cpu,cpu:acc=f16. "
                   "Default: every available backend plus cpu:acc=f16");
    cmd.add_option("-r,--reference", nodes.reference, "Node every other node is compared with")
        ->capture_default_str();
}

void add_timings_flag(CLI::App& cmd, bool& timings, const std::string& what) {
    cmd.add_flag("--timings", timings,
                 "Print where the time went on stderr: " + what +
                     "; and each device node's weight cache (hits, misses, evictions, bytes uploaded). Never in a "
                     "report, which stays reproducible");
}

namespace {
// "42 s", "3 min 05 s", "2 h 07 min".
std::string duration_text(double s) {
    const auto t = static_cast<long long>(std::llround(std::max(0.0, s)));
    if (t < 60) return fmt::format("{} s", t);
    if (t < 3600) return fmt::format("{} min {:02d} s", t / 60, t % 60);
    return fmt::format("{} h {:02d} min", t / 3600, (t % 3600) / 60);
}
}  // namespace

std::string progress_line(const AuditProgress& p, double elapsed_s) {
    // Done: the steps before this one, plus the nodes before this one
    // inside it (a node's share of a step is taken as equal).
    double done = p.step_index > 0 ? p.step_index - 1 : 0;
    if (p.node_index > 0 && p.nodes > 0) done += static_cast<double>(p.node_index - 1) / p.nodes;
    const double fraction = p.steps > 0 ? done / p.steps : 0;
    std::string line = fmt::format("[{}/{} {:3d}%] {}", p.step_index, p.steps, static_cast<int>(100.0 * fraction), p.step);
    if (!p.node.empty()) line += " — " + p.node + (p.node_index > 0 ? fmt::format(" ({}/{})", p.node_index, p.nodes) : "");
    line += fmt::format("  {} elapsed", duration_text(elapsed_s));
    // The rest at the pace so far, once there is a pace to go by.
    if (fraction >= 0.02 && elapsed_s >= 1) line += fmt::format(", ~{} left", duration_text(elapsed_s * (1 - fraction) / fraction));
    return line;
}

std::function<void(const AuditProgress&)> progress_printer() {
    if (!isatty(STDERR_FILENO)) return {};  // a log or CI: no progress lines
    const auto start = std::chrono::steady_clock::now();
    return [start](const AuditProgress& p) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fputs(("\r\033[K" + progress_line(p, elapsed)).c_str(), stderr);
        std::fflush(stderr);
    };
}

void end_progress() {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
}

std::vector<std::string> comma_pieces(const std::string& text) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (true) {
        const std::size_t c = text.find(',', start);
        out.push_back(text.substr(start, c == std::string::npos ? std::string::npos : c - start));
        if (c == std::string::npos) return out;
        start = c + 1;
    }
}

std::vector<std::string> split_commas(const std::vector<std::string>& args) {
    std::vector<std::string> out;
    for (const std::string& a : args)
        for (std::string& piece : comma_pieces(a))
            if (!piece.empty()) out.push_back(std::move(piece));
    return out;
}

}  // namespace kvasir::app
