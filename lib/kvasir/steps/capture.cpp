#include "kvasir/steps/capture.hpp"

#include "kvasir/backend/forwarding.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/model/safetensors_writer.hpp"
#include "kvasir/report/json_common.hpp"
#include "kvasir/report/protocol.hpp"
#include "kvasir/steps/audit_plan.hpp"
#include "kvasir/steps/forward.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace kvasir {

namespace {

// run_op_delta takes owned nodes; capture lends it the caller's.
using Lent = ForwardingBackend;

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

Tensor i32_tensor(const std::vector<std::int32_t>& v) {
    Tensor t(DType::i32, {static_cast<std::int64_t>(v.size())});
    if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(std::int32_t));
    return t;
}

Tensor f64_tensor(const std::vector<double>& v) {
    Tensor t(DType::f64, {static_cast<std::int64_t>(v.size())});
    if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(double));
    return t;
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

CaptureData capture_node(const AuditConfig& ac, Backend& node, Backend& authority, const std::vector<std::string>& steps) {
    KVASIR_ASSERT(ac.protocol != nullptr && ac.model != nullptr);
    const Protocol& p = *ac.protocol;
    const detail::AuditPlan plan = detail::make_audit_plan(ac);
    std::vector<std::string> selected;
    for (const std::string& s : steps)
        KVASIR_CHECK(std::find(plan.steps.begin(), plan.steps.end(), s) != plan.steps.end(), ErrorCode::bad_input,
                     "--steps: protocol '{}' does not run step '{}' (it runs: {})", p.id, s, fmt::join(plan.steps, ", "));
    for (const std::string& s : plan.steps)
        if (steps.empty() || std::find(steps.begin(), steps.end(), s) != steps.end()) selected.push_back(s);
    const auto runs = [&](const char* s) { return std::find(selected.begin(), selected.end(), s) != selected.end(); };
    // The authority capturing itself stores its own free runs: what the audit
    // compares every candidate with.
    const bool self = &node == &authority || node.capabilities().node == authority.capabilities().node;
    const Model& model = *ac.model;

    CaptureData cd;
    nlohmann::ordered_json errors = nlohmann::ordered_json::object();
    nlohmann::ordered_json ops_inputs = nlohmann::ordered_json::object();
    // Runs the node's part of a step; its failure is the node's, recorded.
    auto node_part = [&](const char* step, auto&& body) {
        if (ac.progress) ac.progress({step, 0, 0, node.capabilities().node, 1, 1});
        try {
            body();
        } catch (const Error& e) {
            if (e.code() == ErrorCode::internal) throw;
            errors[step] = e.what();
            std::erase_if(cd.tensors, [&](const auto& kv) { return kv.first.rfind(std::string(step) + ".", 0) == 0; });
        }
    };

    if (plan.ops && runs("ops")) {
        std::vector<std::unique_ptr<Backend>> nodes;
        if (!self) nodes.push_back(std::make_unique<Lent>(authority));
        nodes.push_back(std::make_unique<Lent>(node));
        const std::size_t me = nodes.size() - 1;
        OpsOutputs keep;
        const OpsReport r = run_op_delta(*plan.ops, nodes, 0, &keep);
        std::string failed;
        for (const OpResult& op : r.ops) {
            ops_inputs[op.op] = op.inputs;
            if (!op.errors[me].empty()) failed += (failed.empty() ? "" : "; ") + op.op + ": " + op.errors[me];
        }
        for (const ShardCheck& s : r.shard_checks)
            if (s.node == node.capabilities().node && !s.error.empty()) failed += (failed.empty() ? "" : "; ") + ("shard check: " + s.error);
        if (!failed.empty()) errors["ops"] = failed;
        if (me < keep.size())
            for (auto& [name, t] : keep[me]) cd.tensors.emplace(name, std::move(t));
    }
    if (plan.drift && runs("drift")) {
        const ForwardResult ref = forward(authority, model, plan.drift->tokens.ids);
        node_part("drift", [&] {
            ForwardOptions opt;
            opt.routing = &ref.routing;
            const ForwardResult fr = self ? ForwardResult{} : forward(node, model, plan.drift->tokens.ids, opt);
            const ForwardResult& mine = self ? ref : fr;
            for (std::size_t k = 0; k < mine.hidden.size(); ++k) cd.tensors.emplace(fmt::format("drift.hidden.{}", k), mine.hidden[k]);
        });
    }
    if (plan.logits && runs("logits")) {
        ForwardOptions free_opt;
        free_opt.keep_hidden = false;
        const ForwardResult ref = forward(authority, model, plan.logits->tokens.ids, free_opt);
        node_part("logits", [&] {
            ForwardOptions opt = free_opt;
            opt.routing = &ref.routing;
            cd.tensors.emplace("logits.logits", self ? ref.logits : forward(node, model, plan.logits->tokens.ids, opt).logits);
        });
    }
    if (plan.decide && runs("decide")) {
        ForwardOptions free_opt;
        free_opt.keep_hidden = false;
        const auto& ids = plan.decide->tokens.ids;
        const ForwardResult ref = forward(authority, model, ids, free_opt);
        node_part("decide", [&] {
            ForwardOptions pinned = free_opt;
            pinned.routing = &ref.routing;
            const ForwardResult fr = self ? ForwardResult{} : forward(node, model, ids, free_opt);
            const ForwardResult pn = self ? ForwardResult{} : forward(node, model, ids, pinned);
            cd.tensors.emplace("decide.pinned.logits", self ? ref.logits : pn.logits);
            const ForwardResult& own = self ? ref : fr;
            std::size_t m = 0;
            for (std::int64_t l = 0; l < model.config().num_layers; ++l)
                if (model.config().is_moe(l)) cd.tensors.emplace(fmt::format("decide.free.ids.{}", m++), own.routing[static_cast<std::size_t>(l)].ids);
        });
    }
    if (plan.generate && runs("generate")) {
        const auto& prompt = plan.generate->tokens.ids;
        const int n = plan.generate->new_tokens;
        const GenerateResult ref = greedy_generate(authority, model, prompt, n);
        node_part("generate", [&] {
            if (self) {
                cd.tensors.emplace("generate.tokens", i32_tensor(ref.tokens));
                cd.tensors.emplace("generate.pinned_own", i32_tensor(ref.tokens));
                cd.tensors.emplace("generate.margins", f64_tensor(ref.margins));
                return;
            }
            const GenerateResult fr = greedy_generate(node, model, prompt, n);
            const GenerateResult pn = greedy_generate(node, model, prompt, n, &ref.tokens, &ref.routing);
            cd.tensors.emplace("generate.tokens", i32_tensor(fr.tokens));
            cd.tensors.emplace("generate.pinned_own", i32_tensor(pn.tokens));
            cd.tensors.emplace("generate.margins", f64_tensor(fr.margins));
        });
    }
    if (plan.perplexity && runs("perplexity")) {
        const auto windows =
            perplexity_windows(static_cast<std::int64_t>(plan.perplexity->tokens.ids.size()), plan.perplexity->context);
        const PerplexityPass ref = run_perplexity_windows(authority, *plan.perplexity, windows, nullptr);
        node_part("perplexity", [&] {
            cd.tensors.emplace("perplexity.nll",
                               f64_tensor(self ? ref.nll : run_perplexity_windows(node, *plan.perplexity, windows, &ref).nll));
        });
    }
    if (plan.determinism_tokens && runs("determinism")) {
        node_part("determinism", [&] {
            const double v = detail::determinism_of(node, model, plan.determinism_tokens->ids, plan.repeats);
            cd.tensors.emplace("determinism.run_to_run_max_rel", f64_tensor({v}));
        });
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
    if (!ops_inputs.empty()) m["ops_inputs"] = ops_inputs.dump();
    return cd;
}

}  // namespace kvasir
