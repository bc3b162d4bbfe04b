#include "commands.hpp"

#include "kvasir/arch/architecture.hpp"
#include "kvasir/core/error.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf.hpp"
#include "kvasir/model/model.hpp"
#include "kvasir/model/quant.hpp"
#include "kvasir/model/rope_frequencies.hpp"
#include "kvasir/core/tool_info.hpp"
#include "kvasir/report/text.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <set>

namespace kvasir::app {

namespace {

struct InspectOptions {
    std::string model = default_model_path();
    bool json = false;
    bool tensors = false;
};

std::string human_bytes(std::uint64_t b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(b);
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        ++u;
    }
    return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

// The router's exact rule in one line: scoring, selection, renormalisation,
// groups, scaling.
std::string router_rule(const ModelConfig& c) {
    if (!c.has_moe()) return "none: no MoE layers (a dense SwiGLU MLP on every layer)";
    const RouterConfig& r = c.router;
    std::string s = fmt::format("{} over {} experts, top-{}", router_scoring_name(r.scoring), r.num_experts, r.top_k);
    if (r.score_correction_bias) s += " selected on score + e_score_correction_bias";
    if (r.n_group > 1) s += fmt::format(" within the best {} of {} groups", r.topk_group, r.n_group);
    s += r.norm_topk_prob ? ", weights renormalised to sum 1" : ", weights not renormalised";
    if (r.routed_scaling_factor != 1.0) s += fmt::format(", × {:g}", r.routed_scaling_factor);
    if (c.has_shared_expert())
        s += fmt::format("; plus a shared expert {} wide{}", c.shared_expert_intermediate_size,
                         c.shared_expert_gate ? " × sigmoid(x·shared_expert_gateᵀ)" : "");
    return s;
}

// The rope in one line: theta, the frequency scaling, the rotated share.
std::string rope_rule(const ModelConfig& c) {
    std::string s = fmt::format("rope θ {:g}", c.rope_theta);
    if (c.rope_type == "llama3")
        s += fmt::format(" with llama3 frequency scaling (factor {:g}, low/high freq factor {:g}/{:g}, original context {:g})",
                         c.rope_scaling.factor, c.rope_scaling.low_freq_factor, c.rope_scaling.high_freq_factor,
                         c.rope_scaling.original_max_position_embeddings);
    if (c.rope_type == "yarn")
        s += fmt::format(" with yarn scaling (factor {:g}, beta fast/slow {:g}/{:g}, original context {:g}, mscale {:g}, "
                         "mscale_all_dim {:g}, cos/sin attention factor {:.6g})",
                         c.rope_scaling.factor, c.rope_scaling.beta_fast, c.rope_scaling.beta_slow,
                         c.rope_scaling.original_max_position_embeddings, c.rope_scaling.mscale,
                         c.rope_scaling.mscale_all_dim, rope_attention_factor(c));
    if (!c.rope_freq_factors.empty())
        s += fmt::format(" with GGUF frequency factors [{:g}]", fmt::join(c.rope_freq_factors, ", "));
    if (c.partial_rotary_factor != 1.0) s += fmt::format(" on {:g} of head dim", c.partial_rotary_factor);
    if (c.has_mla()) s += fmt::format(" on the last {} dims of each head (MLA's rope part)", c.rotary_dims());
    return s;
}

// MLA in one line ("" without it): the projections, the ranks, the per-head widths, the softmax scale.
std::string mla_rule(const ModelConfig& c) {
    if (!c.has_mla()) return "";
    const auto& m = c.mla;
    return fmt::format(
        "MLA attention: {}; kv latent rank {} + one shared rope key {} wide (kv_a_proj_with_mqa → kv_a_layernorm → "
        "kv_b_proj); per head q·k over {} nope + {} rope dims, values {} wide; rope pairs {}; softmax scale {:.9g}",
        m.q_lora_rank > 0 ? fmt::format("q-LoRA rank {} (q_a_proj → q_a_layernorm → q_b_proj)", m.q_lora_rank)
                          : std::string("plain q_proj (no q-LoRA)"),
        m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim,
        m.rope_interleave ? "interleaved (x0, x1), (x2, x3), …" : "in halves (rotate_half)", attention_scale(c));
}

// Whether this build runs the full forward pass of the model (its family is registered and accepts the config).
bool full_forward(const ModelConfig& c) {
    try {
        (void)arch::architecture_for(c);
        return true;
    } catch (const Error&) {
        return false;
    }
}

// Which layers use a sliding window ("" when none does).
std::string sliding_rule(const ModelConfig& c) {
    std::vector<std::int64_t> sliding;
    for (std::int64_t l = 0; l < c.num_layers; ++l)
        if (c.attention_window(l) > 0) sliding.push_back(l);
    if (sliding.empty()) return "";
    if (static_cast<std::int64_t>(sliding.size()) == c.num_layers)
        return fmt::format("sliding-window attention ({} keys) on every layer", c.sliding_window);
    return fmt::format("sliding-window attention ({} keys) on layers {}; full causal attention on the others",
                       c.sliding_window, fmt::join(sliding, ", "));
}

// Tensors of the checkpoint that are not the audited text decoder (a
// multimodal wrapper's vision tower, an MTP head): listed, never loaded.
struct Ignored {
    std::int64_t count = 0;
    std::uint64_t bytes = 0;
    std::vector<std::string> examples;
};
// gpt-oss's expert weights as stored: "mxfp4" / "plain" (safetensors), or
// the GGUF type of the expert stacks ("gguf MXFP4").
std::string oss_expert_format(const Model& m) {
    if (const GgufFile* g = m.gguf()) {
        const GgufTensor* t = g->find_tensor("blk.0.ffn_gate_exps.weight");
        return fmt::format("gguf {}", t != nullptr ? ggml_type_name(t->type) : "?");
    }
    return m.config().mxfp4_experts ? "mxfp4" : "plain";
}

Ignored ignored_tensors(const ModelConfig& c, const std::vector<ModelTensorEntry>& table) {
    Ignored out;
    std::set<std::string> used;
    for (const TensorSpec& s : model_tensor_specs(c)) used.insert(s.name);
    for (std::int64_t l = 0; l < c.num_layers; ++l)
        for (const TensorSpec& s : layer_tensor_specs(c, l)) used.insert(s.name);
    for (const ModelTensorEntry& t : table) {
        if (used.count(t.name) != 0) continue;
        ++out.count;
        out.bytes += t.bytes;
        if (out.examples.size() < 3) out.examples.push_back(t.name);
    }
    return out;
}

// The dtypes of each layer's tensors.
struct LayerDtypes {
    std::map<std::int64_t, std::set<std::string>> dtypes;
    std::set<std::string> of(std::int64_t layer) const {
        const auto it = dtypes.find(layer);
        return it != dtypes.end() ? it->second : std::set<std::string>{};
    }
};

// The "config" object of inspect --json: the audited decoder as the tool
// understood it (every rule the forward pass follows).
nlohmann::ordered_json config_json(const Model& model) {
    const ModelConfig& c = model.config();
    nlohmann::ordered_json a;
    a["architecture"] = architecture_name(c.architecture);
    a["layers"] = c.num_layers;
    a["hidden_size"] = c.hidden_size;
    a["heads"] = c.num_heads;
    a["kv_heads"] = c.num_kv_heads;
    a["head_dim"] = c.head_dim;
    a["vocab_size"] = c.vocab_size;
    a["rope_theta"] = c.rope_theta;
    a["rope_type"] = c.rope_type;
    if (c.rope_type == "llama3")
        a["rope_scaling"] = {{"factor", c.rope_scaling.factor},
                             {"low_freq_factor", c.rope_scaling.low_freq_factor},
                             {"high_freq_factor", c.rope_scaling.high_freq_factor},
                             {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
    if (!c.rope_freq_factors.empty()) a["rope_freq_factors"] = c.rope_freq_factors;
    if (c.rope_type == "yarn")
        a["rope_yarn"] = {{"factor", c.rope_scaling.factor},
                          {"beta_fast", c.rope_scaling.beta_fast},
                          {"beta_slow", c.rope_scaling.beta_slow},
                          {"truncate", c.rope_scaling.truncate},
                          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
                          {"mscale", c.rope_scaling.mscale},
                          {"mscale_all_dim", c.rope_scaling.mscale_all_dim},
                          {"attention_factor", rope_attention_factor(c)}};
    a["attention_scale"] = attention_scale(c);
    a["rotary_dims"] = c.rotary_dims();
    if (c.has_mla())
        a["mla"] = {{"q_lora_rank", c.mla.q_lora_rank},           {"kv_lora_rank", c.mla.kv_lora_rank},
                    {"qk_nope_head_dim", c.mla.qk_nope_head_dim}, {"qk_rope_head_dim", c.mla.qk_rope_head_dim},
                    {"v_head_dim", c.mla.v_head_dim},             {"rope_interleave", c.mla.rope_interleave}};
    a["sliding_window"] = c.sliding_window;
    a["attention_output_bias"] = c.attention_out_bias;
    a["rms_norm_eps"] = c.rms_norm_eps;
    a["qk_norm"] = c.qk_norm;
    a["attention_bias"] = c.attention_bias;
    a["tie_word_embeddings"] = c.tie_word_embeddings;
    a["experts"] = c.num_experts();
    a["top_k"] = c.top_k();
    a["norm_topk_prob"] = c.norm_topk_prob();
    a["router_scoring"] = router_scoring_name(c.router.scoring);
    a["moe_intermediate_size"] = c.moe_intermediate_size;
    a["intermediate_size"] = c.intermediate_size;
    a["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    a["shared_expert_gate"] = c.shared_expert_gate;
    a["router_rule"] = router_rule(c);
    a["router"] = {{"scoring", router_scoring_name(c.router.scoring)},
                   {"score_correction_bias", c.router.score_correction_bias},
                   {"n_group", c.router.n_group},
                   {"topk_group", c.router.topk_group},
                   {"routed_scaling_factor", c.router.routed_scaling_factor},
                   {"renormalise", c.norm_topk_prob()},
                   {"first_k_dense_replace", c.first_k_dense_replace}};
    a["layer_kinds"] = c.layer_kinds();
    if (!c.linear_attention_layers.empty()) {
        a["layer_types"] = nlohmann::ordered_json::array();
        for (std::int64_t l = 0; l < c.num_layers; ++l)
            a["layer_types"].push_back(c.is_linear_attention(l) ? "linear_attention" : "full_attention");
        a["linear_attention"] = {{"conv_kernel", c.linear.conv_kernel},       {"key_heads", c.linear.key_heads},
                                 {"value_heads", c.linear.value_heads},       {"key_head_dim", c.linear.key_head_dim},
                                 {"value_head_dim", c.linear.value_head_dim}};
        a["partial_rotary_factor"] = c.partial_rotary_factor;
        a["attention_output_gate"] = c.attention_output_gate;
        a["norm_weight_offset"] = c.norm_weight_offset;
    }
    a["fused_experts"] = c.fused_experts;
    if (family_of(c.architecture).experts == ExpertStorage::gate_up_interleaved) {
        a["expert_format"] = oss_expert_format(model);
        a["attention_sinks"] = c.attention_sinks;
        a["swiglu_alpha"] = c.swiglu_alpha;
        a["swiglu_limit"] = c.swiglu_limit;
    }
    a["multimodal_wrapper"] = c.multimodal_wrapper;
    a["full_forward"] = full_forward(c);
    return a;
}

// inspect --json: schema kvasir-equiv/inspect/1.
nlohmann::ordered_json inspect_json(const Model& model, const std::vector<ModelTensorEntry>& table, const Ignored& ignored,
                                    const LayerDtypes& layer_dtypes) {
    const ModelConfig& c = model.config();
    nlohmann::ordered_json j;
    j["schema"] = "kvasir-equiv/inspect/1";
    j["tool"] = tool_json();
    j["path"] = model.path();
    j["format"] = model.format();
    j["fingerprint"] = model.fingerprint();
    j["config"] = config_json(model);
    j["ignored"] = {{"tensors", ignored.count}, {"bytes", ignored.bytes}, {"examples", ignored.examples}};
    j["layers"] = nlohmann::ordered_json::array();
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
        nlohmann::ordered_json lj;
        lj["layer"] = l;
        lj["kind"] = c.is_moe(l) ? "moe" : "dense";
        if (!c.is_linear_attention(l)) lj["attention_window"] = c.attention_window(l);
        if (!c.linear_attention_layers.empty())
            lj["attention"] = c.is_linear_attention(l) ? "linear (Gated DeltaNet)" : "full";
        lj["bytes"] = model.layer_bytes(l);
        lj["dtypes"] = layer_dtypes.of(l);
        j["layers"].push_back(std::move(lj));
    }
    j["tensors"] = nlohmann::ordered_json::array();
    for (const ModelTensorEntry& t : table) {
        nlohmann::ordered_json tj;
        tj["name"] = t.name;
        tj["dtype"] = t.dtype;
        tj["shape"] = t.shape;
        tj["bytes"] = t.bytes;
        tj["layer"] = t.layer;
        j["tensors"].push_back(std::move(tj));
    }
    return j;
}

// inspect's text: the model in a few lines, a table of layers, the bytes
// per dtype, and with `tensors` every tensor.
void print_inspect(const Model& model, const std::vector<ModelTensorEntry>& table, const Ignored& ignored,
                   const LayerDtypes& layer_dtypes,
                   const std::map<std::string, std::uint64_t>& dtype_bytes, bool tensors) {
    const ModelConfig& c = model.config();
    const Style st = style_for(stdout);
    std::cout << st.bold(model.path()) << "  " << model.format() << "  fingerprint " << model.fingerprint() << "\n";
    std::cout << fmt::format(
        "{}: {} layers, hidden {}, heads {} (kv {}, head dim {}), vocab {}, {}, rms eps {}{}{}{}{}\n",
        architecture_name(c.architecture), c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
        c.vocab_size, rope_rule(c), c.rms_norm_eps, c.qk_norm ? ", q/k norm" : "", c.attention_bias ? ", qkv bias" : "",
        c.attention_out_bias ? ", o_proj bias" : "", c.tie_word_embeddings ? ", tied embeddings" : "");
    if (const std::string sw = sliding_rule(c); !sw.empty()) std::cout << sw << "\n";
    if (c.num_moe_layers() > 0)
        std::cout << fmt::format("MoE: {} experts × {} wide, top-{} ({} router{}){}\n", c.num_experts(),
                                 c.moe_intermediate_size, c.top_k(), router_scoring_name(c.router.scoring),
                                 c.norm_topk_prob() ? ", renormalised" : "",
                                 c.has_shared_expert()
                                     ? fmt::format(", shared expert {} wide{}", c.shared_expert_intermediate_size,
                                                   c.shared_expert_gate ? " with sigmoid gate" : "")
                                     : "");
    std::cout << "router: " << router_rule(c) << "\n";
    std::cout << "layers: " << c.layer_kinds() << "\n";
    if (const std::string m = mla_rule(c); !m.empty()) std::cout << m << "\n";
    if (!c.linear_attention_layers.empty())
        std::cout << fmt::format(
            "hybrid: {} Gated DeltaNet layers (conv kernel {}, {} key heads × {}, {} value heads × {}) and {} gated "
            "full-attention layers (output gate, rope on {:g} of head dim, {}){}\n",
            std::count(c.linear_attention_layers.begin(), c.linear_attention_layers.end(), true), c.linear.conv_kernel,
            c.linear.key_heads, c.linear.key_head_dim, c.linear.value_heads, c.linear.value_head_dim,
            std::count(c.linear_attention_layers.begin(), c.linear_attention_layers.end(), false),
            c.partial_rotary_factor,
            c.norm_weight_offset ? "RMSNorm weights w, scaling by 1 + w" : "RMSNorm scales 1 + w stored as such (llama.cpp's converter)",
            full_forward(c) ? "" : "; full forward pass not implemented yet: layer-level steps");
    if (c.fused_experts) std::cout << "experts stored fused ([E, 2I, H] gate_up_proj, [E, H, I] down_proj), read per expert\n";
    if (family_of(c.architecture).experts == ExpertStorage::gate_up_interleaved)
        std::cout << fmt::format(
            "gpt-oss: attention sinks (one logit per head), router logits with a bias, experts with biases and the "
            "clamped SwiGLU (alpha {:g}, limit {:g}); expert weights {}\n",
            c.swiglu_alpha, c.swiglu_limit,
            model.gguf() != nullptr
                ? fmt::format("ffn_gate/up/down_exps stacks ({}) with .bias tensors; alpha and limit are llama.cpp's "
                              "constants (a GGUF carries neither)", oss_expert_format(model))
            : c.mxfp4_experts ? "MXFP4 (*_blocks U8: two e2m1 per byte; *_scales U8: e8m0 per 32 values), expanded to f32 "
                                "exactly as transformers does"
                              : "unquantised ([E, H, 2I] gate_up_proj, gate/up interleaved; [E, I, H] down_proj)");
    if (ignored.count > 0)
        std::cout << fmt::format("ignored: {} tensors ({}) that are not the audited text decoder, e.g. {}\n", ignored.count,
                                 human_bytes(ignored.bytes), fmt::join(ignored.examples, ", "));
    std::cout << "\n";
    const bool hybrid = !c.linear_attention_layers.empty();
    TextTable lt(hybrid ? std::vector<std::string>{"layer", "attention", "kind", "bytes", "dtypes"}
                        : std::vector<std::string>{"layer", "kind", "bytes", "dtypes"});
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
        std::vector<std::string> row{std::to_string(l)};
        if (hybrid) row.push_back(c.is_linear_attention(l) ? "linear" : "full");
        for (std::string cell : {std::string(c.is_moe(l) ? "moe" : "dense"), human_bytes(model.layer_bytes(l)),
                                 fmt::format("{}", fmt::join(layer_dtypes.of(l), " "))})
            row.push_back(std::move(cell));
        lt.add_row(row);
    }
    std::cout << lt.render();
    std::uint64_t total = 0;
    for (const auto& [d, b] : dtype_bytes) total += b;
    std::cout << fmt::format("\n{} tensors, {} in all", table.size(), human_bytes(total));
    for (const auto& [d, b] : dtype_bytes) std::cout << fmt::format("; {} {}", d, human_bytes(b));
    std::cout << "\n";
    if (tensors) {
        TextTable tt({"tensor", "dtype", "shape", "bytes"});
        for (const ModelTensorEntry& t : table) tt.add_row({t.name, t.dtype, shape_str(t.shape), std::to_string(t.bytes)});
        std::cout << "\n" << tt.render();
    } else {
        std::cout << st.dim("(--tensors lists every tensor)") << "\n";
    }
}

void run_inspect(const InspectOptions& opt) {
    const Model model = Model::open(opt.model);
    model.check_tensor_shapes();  // a config that disagrees with its tensors is an error, not a description
    const std::vector<ModelTensorEntry> table = model.tensor_table();
    const Ignored ignored = model.format() == "safetensors" ? ignored_tensors(model.config(), table) : Ignored{};
    LayerDtypes layer_dtypes;
    std::map<std::string, std::uint64_t> dtype_bytes;
    for (const ModelTensorEntry& t : table) {
        layer_dtypes.dtypes[t.layer].insert(t.dtype);
        dtype_bytes[t.dtype] += t.bytes;
    }
    if (opt.json)
        std::cout << inspect_json(model, table, ignored, layer_dtypes).dump(2) << '\n';
    else
        print_inspect(model, table, ignored, layer_dtypes, dtype_bytes, opt.tensors);
}

}  // namespace

void set_inspect_command(CLI::App& app) {
    auto opt = std::make_shared<InspectOptions>();
    CLI::App* cmd = app.add_subcommand("inspect", "Describe a model: architecture, MoE/dense layers, experts, dtypes, bytes per layer, tensors");
    cmd->add_option("model", opt->model, "HF folder, .safetensors file or .gguf file (default: the embedded fixture)");
    cmd->add_flag("--json", opt->json, "Print as JSON");
    cmd->add_flag("--tensors", opt->tensors, "List every tensor");
    cmd->callback([opt] { run_inspect(*opt); });
}

}  // namespace kvasir::app
