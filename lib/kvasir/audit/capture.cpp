#include "kvasir/audit/capture.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/process_memory.hpp"
#include "kvasir/model/safetensors_writer.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"
#include "kvasir/audit/protocol.hpp"
#include "kvasir/audit/audit_plan.hpp"
#include "kvasir/audit/step.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <cstring>

namespace kvasir {

namespace {

const char* safetensors_dtype(DType d) {
    switch (d) {
        case DType::f64: return "F64";
        case DType::f32: return "F32";
        case DType::f16: return "F16";
        case DType::bf16: return "BF16";
        case DType::i32: return "I32";
    }
    return "?";
}

const std::string& required(const std::map<std::string, std::string>& meta, const std::string& path, const std::string& key) {
    const auto it = meta.find(key);
    KVASIR_CHECK(it != meta.end(), ErrorCode::bad_input, "{}: not a capture: __metadata__ has no '{}'", path, key);
    return it->second;
}

nlohmann::json parse_meta_json(const std::string& path, const std::string& key, const std::string& text) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    KVASIR_CHECK(!j.is_discarded(), ErrorCode::bad_input, "{}: __metadata__ '{}' is not valid JSON", path, key);
    return j;
}

}  // namespace

std::string capture_content_hash(const std::map<std::string, std::string>& metadata,
                                 const std::map<std::string, TensorView>& tensors) {
    std::string buf = std::string(kCaptureFormat) + "\n";
    for (const auto& [k, v] : metadata) {
        if (k == "content_hash") continue;
        buf += k + "=" + v + "\n";
    }
    for (const auto& [name, t] : tensors) {
        std::string dims;
        for (std::size_t i = 0; i < t.shape.size(); ++i) dims += (i ? "," : "") + std::to_string(t.shape[i]);
        const std::size_t bytes = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype);
        buf += fmt::format("{}\n{}\n{}\n{}\n", name, safetensors_dtype(t.dtype), dims, bytes);
        buf.append(static_cast<const char*>(t.data), bytes);
    }
    return "sha256:" + sha256_hex(buf);
}

void write_capture(const std::string& path, const CaptureData& capture) {
    std::map<std::string, TensorView> views;
    for (const auto& [name, t] : capture.tensors) views.emplace(name, t.view());
    std::map<std::string, std::string> meta = capture.metadata;
    meta["content_hash"] = capture_content_hash(meta, views);
    write_safetensors(path, views, meta);
}

Capture Capture::open(const std::string& path) {
    Capture c;
    c.path_ = path;
    c.file_ = std::make_shared<SafetensorsFile>(SafetensorsFile::open(path));
    const auto& meta = c.file_->metadata();
    const std::string& format = required(meta, path, "format");
    KVASIR_CHECK(format == kCaptureFormat, ErrorCode::bad_input, "{}: capture format '{}', this tool reads '{}'", path, format,
                 kCaptureFormat);
    for (const char* key : {"node", "capabilities", "protocol_id", "protocol_version", "protocol_hash", "seed",
                            "model_fingerprint", "tool", "steps", "errors", "content_hash"})
        (void)required(meta, path, key);
    // Integrity first: everything below is read from what the hash covers.
    std::map<std::string, TensorView> views;
    for (const std::string& name : c.file_->names()) views.emplace(name, c.file_->view(name));
    const std::string actual = capture_content_hash(meta, views);
    KVASIR_CHECK(actual == meta.at("content_hash"), ErrorCode::bad_input,
                 "{}: content hash mismatch (recorded {}, computed {}): the capture was modified after it was written", path,
                 meta.at("content_hash"), actual);
    c.node_ = meta.at("node");
    KVASIR_CHECK(!c.node_.empty(), ErrorCode::bad_input, "{}: empty node name", path);
    const nlohmann::json caps = parse_meta_json(path, "capabilities", meta.at("capabilities"));
    KVASIR_CHECK(caps.is_object(), ErrorCode::bad_input, "{}: capabilities must be a JSON object", path);
    c.capabilities_ = nlohmann::ordered_json::parse(meta.at("capabilities"));
    const std::string& seed = meta.at("seed");
    char* end = nullptr;
    errno = 0;
    c.seed_ = std::strtoull(seed.c_str(), &end, 10);
    KVASIR_CHECK(!seed.empty() && *end == '\0' && errno == 0 && seed[0] != '-', ErrorCode::bad_input,
                 "{}: seed '{}' is not an unsigned integer", path, seed);
    const nlohmann::json steps = parse_meta_json(path, "steps", meta.at("steps"));
    KVASIR_CHECK(steps.is_array(), ErrorCode::bad_input, "{}: steps must be a JSON array", path);
    for (const auto& s : steps) {
        KVASIR_CHECK(s.is_string(), ErrorCode::bad_input, "{}: steps must hold strings", path);
        c.steps_.push_back(s.get<std::string>());
    }
    const nlohmann::json errors = parse_meta_json(path, "errors", meta.at("errors"));
    KVASIR_CHECK(errors.is_object(), ErrorCode::bad_input, "{}: errors must be a JSON object", path);
    for (const auto& [k, v] : errors.items()) {
        KVASIR_CHECK(v.is_string(), ErrorCode::bad_input, "{}: errors/{} must be a string", path, k);
        c.errors_[k] = v.get<std::string>();
    }
    // Optional (external writers): steps this node cannot provide, and why.
    if (const auto it = meta.find("not_captured"); it != meta.end()) {
        const nlohmann::json nc = parse_meta_json(path, "not_captured", it->second);
        KVASIR_CHECK(nc.is_object(), ErrorCode::bad_input, "{}: not_captured must be a JSON object", path);
        for (const auto& [k, v] : nc.items()) {
            KVASIR_CHECK(v.is_string() && !v.get<std::string>().empty(), ErrorCode::bad_input,
                         "{}: not_captured/{} must be a non-empty string (why the step is not captured)", path, k);
            KVASIR_CHECK(std::find(c.steps_.begin(), c.steps_.end(), k) == c.steps_.end(), ErrorCode::bad_input,
                         "{}: step '{}' is both captured and not captured", path, k);
            c.not_captured_[k] = v.get<std::string>();
        }
    }
    // Optional (kvasir's fault-injecting nodes): what the fault did per step.
    if (const auto it = meta.find("faults_injected"); it != meta.end()) {
        const nlohmann::json f = parse_meta_json(path, "faults_injected", it->second);
        KVASIR_CHECK(f.is_object(), ErrorCode::bad_input, "{}: faults_injected must be a JSON object", path);
        auto& out = c.faults_.emplace();
        for (const auto& [k, v] : f.items()) {
            KVASIR_CHECK(v.is_number_unsigned(), ErrorCode::bad_input,
                         "{}: faults_injected/{} must be a non-negative integer", path, nlohmann::json(k).dump());
            KVASIR_CHECK(std::find(c.steps_.begin(), c.steps_.end(), k) != c.steps_.end(), ErrorCode::bad_input,
                         "{}: faults_injected names step {}, which the capture does not list", path, nlohmann::json(k).dump());
            out[k] = static_cast<std::int64_t>(std::min<std::uint64_t>(v.get<std::uint64_t>(), std::uint64_t{1} << 62));
        }
    }
    // A node that runs its own router and decoding (an external runtime:
    // llama.cpp) declares "authority": "none"; kvasir's own captures are pinned.
    if (const auto a = caps.find("authority"); a != caps.end()) {
        KVASIR_CHECK(a->is_string(), ErrorCode::bad_input, "{}: capabilities/authority must be a string", path);
        c.free_running_ = a->get<std::string>() == "none";
    }
    return c;
}

const std::string& Capture::protocol_hash() const { return file_->metadata().at("protocol_hash"); }
const std::string& Capture::model_fingerprint() const { return file_->metadata().at("model_fingerprint"); }

bool Capture::has_step(const std::string& step) const {
    return std::find(steps_.begin(), steps_.end(), step) != steps_.end() && errors_.count(step) == 0;
}

TensorView Capture::view(const std::string& tensor) const {
    KVASIR_CHECK(file_->contains(tensor), ErrorCode::bad_input, "{}: capture has no tensor '{}'", path_, tensor);
    return file_->view(tensor);
}

std::optional<std::string> Capture::note(const std::string& key) const { return file_->metadata_value(key); }

namespace {

constexpr const char* kDecisionsFormat = "kvasir-equiv/decisions/1";

// A decisions file read back, as the NodeOutputs Step::load_decisions reads.
class DecisionsFile final : public NodeOutputs {
public:
    explicit DecisionsFile(const std::string& path)
        : path_(path), file_(std::make_shared<SafetensorsFile>(SafetensorsFile::open(path))) {}
    const std::string& node() const override { return node_; }
    const std::string& origin() const override { return path_; }
    bool has(const std::string& tensor) const override { return file_->contains(tensor); }
    TensorView view(const std::string& tensor) const override {
        KVASIR_CHECK(file_->contains(tensor), ErrorCode::bad_input, "{}: no tensor '{}'", path_, tensor);
        return file_->view(tensor);
    }
    std::optional<std::string> note(const std::string& key) const override { return file_->metadata_value(key); }

private:
    std::string path_, node_ = "decisions";
    std::shared_ptr<SafetensorsFile> file_;
};

// What a decisions file must say to be this capture's.
std::map<std::string, std::string> decisions_identity(const Protocol& p, std::uint64_t seed, const Model& model, Backend& authority,
                                                      const std::string& step) {
    return {{"format", kDecisionsFormat},
            {"step", step},
            {"protocol_hash", p.content_hash},
            {"seed", std::to_string(seed)},
            {"model_fingerprint", model.fingerprint()},
            {"authority", authority.capabilities().node}};
}

std::string decisions_path(const SharedDecisions& shared, const std::string& step) {
    return (std::filesystem::path(shared.dir) / (step + ".decisions")).string();
}

std::any read_shared_decisions(const SharedDecisions& shared, const Step& step, const StepEnv& env,
                               const std::map<std::string, std::string>& identity) {
    const std::string path = decisions_path(shared, step.name());
    const std::string failed = (std::filesystem::path(shared.dir) / "failed").string();
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
        if (std::filesystem::exists(path)) break;
        KVASIR_CHECK(!std::filesystem::exists(failed), ErrorCode::backend_failure,
                     "the authority's process failed before deciding step {} ({})", step.name(), shared.dir);
        KVASIR_CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < shared.wait_s,
                     ErrorCode::backend_failure, "no decisions for step {} in {} after {} s", step.name(), shared.dir, shared.wait_s);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto file = open_decisions_file(path);
    for (const auto& [key, want] : identity) {
        const std::optional<std::string> got = file->note(key);
        KVASIR_CHECK(got && *got == want, ErrorCode::bad_input, "{}: {} is '{}', this capture's is '{}'", path, key,
                     got.value_or("(absent)"), want);
    }
    return step.load_decisions(env, *file);
}

void write_shared_decisions(const SharedDecisions& shared, const Step& step, const std::any& decisions,
                            const std::map<std::string, std::string>& identity) {
    const NamedTensors tensors = step.save_decisions(decisions);
    std::map<std::string, TensorView> views;
    for (const auto& [name, t] : tensors) views.emplace(name, t.view());
    write_safetensors(decisions_path(shared, step.name()), views, identity);
}

}  // namespace

std::unique_ptr<NodeOutputs> open_decisions_file(const std::string& path) { return std::make_unique<DecisionsFile>(path); }

CaptureData capture_node(const AuditConfig& ac, Backend& node, Backend& authority, const std::vector<std::string>& steps,
                         const SharedDecisions& shared) {
    KVASIR_ASSERT(ac.protocol != nullptr && ac.model != nullptr);
    const Protocol& p = *ac.protocol;
    AuditConfig narrowed = ac;  // only the steps asked for are planned (their token streams read)
    narrowed.only_steps = steps;
    const detail::AuditPlan plan = detail::make_audit_plan(narrowed);
    const std::vector<std::string>& selected = plan.steps;
    // The authority capturing itself stores its own free runs: what the audit
    // compares every candidate with.
    const bool self = &node == &authority || node.capabilities().node == authority.capabilities().node;
    const Model& model = *ac.model;
    const StepEnv env{&p, &plan, &model};
    const PeakMemoryWatch memory;
    using Mode = SharedDecisions::Mode;
    KVASIR_CHECK(shared.mode != Mode::read || !self, ErrorCode::bad_input,
                 "{} is the authority: it decides, it does not read decisions", node.capabilities().node);
    KVASIR_CHECK(shared.mode == Mode::none || !shared.dir.empty(), ErrorCode::bad_input, "no folder for shared decisions");

    // The authority's decisions, step by step: decided here, or read from
    // the reference's process. A writer decides every step before it
    // collects any, so that the readers wait as little as possible.
    std::vector<std::any> decided(selected.size());
    std::vector<double> seconds_of(selected.size(), 0.0);
    const auto decide = [&](std::size_t k) {
        const auto t0 = std::chrono::steady_clock::now();
        const Step& step = step_named(selected[k]);
        const bool shares = shared.mode != Mode::none && step.shares_decisions();
        const auto identity = shares ? decisions_identity(p, plan.seed, model, authority, selected[k]) : std::map<std::string, std::string>{};
        // The authority's failure is not the node's: it ends the capture.
        if (shares && shared.mode == Mode::read) {
            decided[k] = read_shared_decisions(shared, step, env, identity);
        } else {
            decided[k] = step.decide(env, authority);
            if (shares) write_shared_decisions(shared, step, decided[k], identity);
        }
        seconds_of[k] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    if (shared.mode == Mode::write) {
        std::filesystem::remove(std::filesystem::path(shared.dir) / "failed");  // a marker an earlier writer left
        try {
            for (std::size_t k = 0; k < selected.size(); ++k) decide(k);
        } catch (...) {
            std::ofstream((std::filesystem::path(shared.dir) / "failed").string()) << "failed\n";
            throw;
        }
    }

    CaptureData cd;
    nlohmann::ordered_json errors = nlohmann::ordered_json::object();
    nlohmann::ordered_json seconds = nlohmann::ordered_json::object();
    nlohmann::ordered_json faults = nlohmann::ordered_json::object();
    nlohmann::ordered_json step_transfers = nlohmann::ordered_json::object();
    for (std::size_t k = 0; k < selected.size(); ++k) {
        const std::string& name = selected[k];
        if (ac.progress) ac.progress({name, static_cast<int>(k + 1), static_cast<int>(selected.size()), node.capabilities().node, 1, 1});
        if (shared.mode != Mode::write) decide(k);
        const auto t0 = std::chrono::steady_clock::now();
        const Step& step = step_named(name);
        StepOutput out;
        const std::optional<std::int64_t> faults_before = node.injected_faults();
        const std::optional<TransferStats> transfers_before = node.transfer_stats();
        // A device node's results left on the device come back inside their
        // step, so its time and traffic count reading them.
        if (auto why = as_node_failure([&] {
                out = step.collect(env, node, decided[k], self);
                for (const auto& [key, t] : out.tensors) (void)t.raw();
            })) {
            errors[name] = *why;
        } else {
            if (faults_before) faults[name] = *node.injected_faults() - *faults_before;
            if (self) detail::check_reference_finite(out, node.capabilities().node, name, &model);
            for (auto& [key, t] : out.tensors) cd.tensors.insert_or_assign(key, std::move(t));
            for (auto& [key, v] : out.notes) cd.metadata.insert_or_assign(key, std::move(v));
        }
        decided[k] = std::any{};  // (a step's decisions can be large: routing of every request)
        seconds[name] = seconds_of[k] + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (transfers_before) step_transfers[name] = to_json(*node.transfer_stats() - *transfers_before);
    }

    // Model-independent: step 1 with seeded weights only.
    const bool model_free = std::all_of(selected.begin(), selected.end(), [](const std::string& s) { return s == "ops"; }) &&
                            p.ops.weights == "seeded";
    auto& m = cd.metadata;
    m["format"] = kCaptureFormat;
    m["node"] = node.capabilities().node;
    m["capabilities"] = to_json(node.capabilities()).dump();
    m["protocol_id"] = p.id;
    m["protocol_version"] = std::to_string(p.version);
    m["protocol_hash"] = p.content_hash;
    m["seed"] = std::to_string(plan.seed);
    m["model_fingerprint"] = model_free ? "" : model.fingerprint();
    m["tool"] = tool_json().dump();
    m["steps"] = nlohmann::json(selected).dump();
    m["errors"] = errors.dump();
    m["authority"] = authority.capabilities().node;
    m["step_seconds"] = seconds.dump();
    // The capturing process's peak resident memory (an audit's node process: the node's own).
    if (rusage ru{}; ::getrusage(RUSAGE_SELF, &ru) == 0) m["peak_rss_bytes"] = std::to_string(static_cast<std::uint64_t>(ru.ru_maxrss) * 1024);
    m["peak_own_bytes"] = std::to_string(memory.peak_own());
    if (const auto cache = node.weight_cache_stats()) m["weight_cache"] = to_json(*cache).dump();
    if (const auto transfers = node.transfer_stats()) {
        m["transfers"] = to_json(*transfers).dump();
        m["step_transfers"] = step_transfers.dump();
    }
    if (node.injected_faults()) m["faults_injected"] = faults.dump();
    return cd;
}

RunTimings timings_of_captures(const std::vector<const Capture*>& captures, std::vector<std::string> steps) {
    std::vector<NodeMetadata> nodes;
    for (const Capture* c : captures) nodes.push_back({c->node(), &c->metadata()});
    return timings_of_metadata(nodes, std::move(steps));
}

RunTimings timings_of_metadata(const std::vector<NodeMetadata>& captures, std::vector<std::string> steps) {
    const auto note = [](const NodeMetadata& c, const char* key) -> std::optional<std::string> {
        const auto it = c.metadata->find(key);
        if (it == c.metadata->end()) return std::nullopt;
        return it->second;
    };
    if (steps.empty())  // every step some capture timed, in the order it ran them
        for (const NodeMetadata& c : captures)
            if (const auto j = note(c, "step_seconds")) {
                const auto doc = nlohmann::ordered_json::parse(*j, nullptr, false);
                if (!doc.is_object()) continue;
                for (const auto& item : doc.items())
                    if (std::find(steps.begin(), steps.end(), item.key()) == steps.end()) steps.push_back(item.key());
            }
    RunTimings t;
    t.load_note = "each node's process reads its own weights (inside its step seconds)";
    for (const NodeMetadata& c : captures) t.nodes.push_back(c.node);
    for (const std::string& step : steps) {
        StepTiming st{step, 0, {}};
        for (const NodeMetadata& c : captures) {
            double s = 0;
            if (const auto j = note(c, "step_seconds")) {
                const auto doc = nlohmann::json::parse(*j, nullptr, false);
                if (doc.is_object() && doc.contains(step) && doc[step].is_number()) s = doc[step].get<double>();
            }
            st.node_seconds.push_back(s);
            st.wall += s;
        }
        t.steps.push_back(std::move(st));
    }
    for (const NodeMetadata& c : captures) {
        const auto bytes_note = [&](const char* key) -> std::optional<std::uint64_t> {
            const auto text = note(c, key);
            std::uint64_t bytes = 0;
            if (!text) return std::nullopt;
            const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), bytes);
            if (ec != std::errc() || end != text->data() + text->size()) return std::nullopt;
            return bytes;
        };
        if (const auto rss = bytes_note("peak_rss_bytes")) t.peak_memory.push_back({c.node, bytes_note("peak_own_bytes").value_or(0), *rss});
        if (const auto j = note(c, "weight_cache"))
            if (const auto stats = weight_cache_stats_from_json(nlohmann::json::parse(*j, nullptr, false)))
                t.weight_caches.emplace_back(c.node, *stats);
        if (const auto j = note(c, "transfers"))
            if (const auto stats = transfer_stats_from_json(nlohmann::json::parse(*j, nullptr, false))) {
                NodeTransfers nt{c.node, *stats, {}};
                if (const auto per = note(c, "step_transfers")) {
                    const auto doc = nlohmann::ordered_json::parse(*per, nullptr, false);
                    if (doc.is_object())
                        for (const auto& item : doc.items())
                            if (const auto s = transfer_stats_from_json(item.value())) nt.steps.emplace_back(item.key(), *s);
                }
                t.transfers.push_back(std::move(nt));
            }
    }
    return t;
}

}  // namespace kvasir
