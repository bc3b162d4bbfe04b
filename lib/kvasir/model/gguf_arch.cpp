// llama.cpp's GGUF naming (gguf_arch.hpp): tensor names → neutral roles,
// and the per-architecture hyperparameters read from `<arch>.*` metadata.
#include "kvasir/model/gguf_arch.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf_text.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <limits>
#include <type_traits>
#include <variant>

namespace kvasir {

using namespace gguf_detail;

// ---------------------------------------------------------------------------
// Tensor names
// ---------------------------------------------------------------------------

namespace {
struct RoleName {
    std::string_view name;
    GgufRole role;
    bool per_layer;
    bool expert_stacked;
};
// llama.cpp's names (src/llama-arch.cpp LLM_TENSOR_NAMES), base part only.
constexpr std::array<RoleName, 42> kRoleNames = {{
    {"token_embd", GgufRole::token_embd, false, false},
    {"output_norm", GgufRole::output_norm, false, false},
    {"output", GgufRole::output, false, false},
    {"attn_norm", GgufRole::attn_norm, true, false},
    {"attn_q", GgufRole::attn_q, true, false},
    {"attn_k", GgufRole::attn_k, true, false},
    {"attn_v", GgufRole::attn_v, true, false},
    {"attn_output", GgufRole::attn_output, true, false},
    {"attn_q_norm", GgufRole::attn_q_norm, true, false},
    {"attn_k_norm", GgufRole::attn_k_norm, true, false},
    {"ffn_norm", GgufRole::ffn_norm, true, false},
    {"ffn_gate_inp", GgufRole::ffn_gate_inp, true, false},
    {"ffn_gate_exps", GgufRole::ffn_gate_exps, true, true},
    {"ffn_up_exps", GgufRole::ffn_up_exps, true, true},
    {"ffn_down_exps", GgufRole::ffn_down_exps, true, true},
    {"ffn_gate_inp_shexp", GgufRole::ffn_gate_inp_shexp, true, false},
    {"ffn_gate_shexp", GgufRole::ffn_gate_shexp, true, false},
    {"ffn_up_shexp", GgufRole::ffn_up_shexp, true, false},
    {"ffn_down_shexp", GgufRole::ffn_down_shexp, true, false},
    {"ffn_gate", GgufRole::ffn_gate, true, false},
    {"ffn_up", GgufRole::ffn_up, true, false},
    {"ffn_down", GgufRole::ffn_down, true, false},
    {"exp_probs_b", GgufRole::exp_probs_b, true, false},
    {"attn_sinks", GgufRole::attn_sinks, true, false},
    {"post_attention_norm", GgufRole::post_attention_norm, true, false},
    {"attn_q_a", GgufRole::attn_q_a, true, false},
    {"attn_q_a_norm", GgufRole::attn_q_a_norm, true, false},
    {"attn_q_b", GgufRole::attn_q_b, true, false},
    {"attn_kv_a_mqa", GgufRole::attn_kv_a_mqa, true, false},
    {"attn_kv_a_norm", GgufRole::attn_kv_a_norm, true, false},
    {"attn_k_b", GgufRole::attn_k_b, true, false},
    {"attn_v_b", GgufRole::attn_v_b, true, false},
    {"attn_qkv", GgufRole::attn_qkv, true, false},
    {"attn_gate", GgufRole::attn_gate, true, false},
    {"ssm_ba", GgufRole::ssm_ba, true, false},
    {"ssm_beta", GgufRole::ssm_beta, true, false},
    {"ssm_alpha", GgufRole::ssm_alpha, true, false},
    {"ssm_conv1d", GgufRole::ssm_conv1d, true, false},
    {"ssm_a", GgufRole::ssm_a, true, false},
    {"ssm_dt", GgufRole::ssm_dt, true, false},
    {"ssm_norm", GgufRole::ssm_norm, true, false},
    {"ssm_out", GgufRole::ssm_out, true, false},
}};

// A plain non-negative decimal below 2^31 (no sign, no leading zeros except "0").
std::optional<int> parse_index(std::string_view s) {
    if (s.empty() || s.size() > 10 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
    std::int64_t v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return std::nullopt;
        v = v * 10 + (c - '0');
    }
    if (v > std::numeric_limits<int>::max()) return std::nullopt;
    return static_cast<int>(v);
}

const RoleName* lookup_role(std::string_view base) {
    for (const auto& r : kRoleNames)
        if (r.name == base) return &r;
    return nullptr;
}
}  // namespace

std::string_view gguf_role_name(GgufRole role) noexcept {
    for (const auto& r : kRoleNames)
        if (r.role == role) return r.name;
    return "?";
}

std::optional<GgufTensorRole> gguf_tensor_role(std::string_view name) {
    GgufTensorRole out;
    // Suffix: ".weight" or ".bias". exp_probs_b is always a bias, whatever
    // llama.cpp's suffix ("blk.N.exp_probs_b.bias").
    if (name.ends_with(".weight")) {
        name.remove_suffix(7);
    } else if (name.ends_with(".bias")) {
        name.remove_suffix(5);
        out.bias = true;
    } else if (!(name.starts_with("blk.") && name.ends_with(".ssm_a"))) {  // llama.cpp stores ssm_a bare
        return std::nullopt;
    }
    if (!name.starts_with("blk.")) {
        const auto* r = lookup_role(name);
        if (r == nullptr || r->per_layer) return std::nullopt;
        out.role = r->role;
        return out;
    }
    name.remove_prefix(4);
    const auto dot = name.find('.');
    if (dot == std::string_view::npos) return std::nullopt;
    const auto layer = parse_index(name.substr(0, dot));
    if (!layer) return std::nullopt;
    out.layer = *layer;
    std::string_view base = name.substr(dot + 1);
    // Legacy Mixtral conversions store one tensor per expert: blk.N.ffn_gate.E.
    if (const auto edot = base.find('.'); edot != std::string_view::npos) {
        const auto expert = parse_index(base.substr(edot + 1));
        base = base.substr(0, edot);
        if (!expert || (base != "ffn_gate" && base != "ffn_up" && base != "ffn_down")) return std::nullopt;
        out.expert = *expert;
    }
    const auto* r = lookup_role(base);
    if (r == nullptr || !r->per_layer) return std::nullopt;
    out.role = r->role;
    out.expert_stacked = r->expert_stacked;
    if (r->role == GgufRole::exp_probs_b) out.bias = true;
    return out;
}

// ---------------------------------------------------------------------------
// Hyperparameters
// ---------------------------------------------------------------------------

std::string gguf_supported_architectures() {
    std::vector<std::string_view> names;
    for (const Family* f : all_families())
        if (!f->gguf_architecture.empty() &&
            std::find(names.begin(), names.end(), f->gguf_architecture) == names.end())
            names.push_back(f->gguf_architecture);
    return fmt::format("{}", fmt::join(names, ", "));
}

namespace {

// `<arch>.<suffix>` metadata of one file, with the checks every reader shares.
struct ArchKeys {
    const GgufFile& file;
    const std::string& fname;
    const std::string& arch;
    std::string key(std::string_view suffix) const { return fmt::format("{}.{}", arch, suffix); }
    std::int64_t opt_int(std::string_view suffix, std::int64_t fallback) const {
        const std::string k = key(suffix);
        return file.has(k) ? file.get_int(k) : fallback;
    }
    std::int64_t positive(std::string_view suffix, std::int64_t v) const {
        if (v <= 0 || v > (std::int64_t{1} << 31))
            fail(ErrorCode::bad_input, "{}: {} is {}, not a positive count", fname, key(suffix), v);
        return v;
    }
    // v within [lo, 2^31].
    std::int64_t in(std::string_view suffix, std::int64_t v, std::int64_t lo) const {
        if (v < lo || v > (std::int64_t{1} << 31))
            fail(ErrorCode::bad_input, "{}: {} is {}, not in [{}, 2^31]", fname, key(suffix), v, lo);
        return v;
    }
};

// head_count_kv may be per-layer (an array) in some converters; we accept that only when every layer agrees.
std::int64_t read_head_count_kv(const ArchKeys& k, std::int64_t head_count) {
    const std::string name = k.key("attention.head_count_kv");
    const GgufValue* v = k.file.find(name);
    if (v == nullptr) return head_count;
    if (!v->is_array()) return k.file.get_int(name);
    std::optional<std::int64_t> common;
    std::visit(
        [&](const auto& vec) {
            using E = typename std::decay_t<decltype(vec)>::value_type;
            if constexpr (std::is_integral_v<E> && !std::is_same_v<E, bool>) {
                for (const auto& e : vec) {
                    const auto x = static_cast<std::int64_t>(e);
                    if (common && *common != x) fail(ErrorCode::unsupported, "{}: {} varies per layer (not supported)", k.fname, name);
                    common = x;
                }
            }
        },
        *v->array());
    if (!common) fail(ErrorCode::bad_input, "{}: {} is {}, not an integer", k.fname, name, v->summary(0));
    return *common;
}

// llama.cpp's hybrid hparams (llama_model::load_hparams): the DeltaNet's widths and the layer pattern.
void read_hybrid_hparams(const ArchKeys& k, GgufModelParams& p) {
    const auto width = [&](std::string_view suffix) { return k.positive(suffix, k.file.get_int(k.key(suffix))); };
    p.ssm_conv_kernel = width("ssm.conv_kernel");
    p.ssm_state_size = width("ssm.state_size");
    p.ssm_group_count = width("ssm.group_count");
    p.ssm_time_step_rank = width("ssm.time_step_rank");
    p.ssm_inner_size = width("ssm.inner_size");
    p.rope_dimension_count = k.positive("rope.dimension_count", k.file.get_int(k.key("rope.dimension_count")));
    const std::string name = k.key("attention.recurrent_layers");
    const GgufValue& v = k.file.get(name);
    if (!v.is_array() || v.array_type() != GgufType::boolean || v.array_size() != static_cast<std::size_t>(p.block_count))
        fail(ErrorCode::bad_input, "{}: {} is {}, not {} booleans (one per layer)", k.fname, name, v.summary(0), p.block_count);
    p.recurrent_layers = k.file.get_array_bool(name);
    if (p.ssm_inner_size != p.ssm_time_step_rank * p.ssm_state_size || p.ssm_time_step_rank % p.ssm_group_count != 0)
        fail(ErrorCode::bad_input, "{}: ssm widths disagree: inner_size {} for {} value heads of {}, {} key heads", k.fname,
             p.ssm_inner_size, p.ssm_time_step_rank, p.ssm_state_size, p.ssm_group_count);
}

// llama.cpp's deepseek2 hparams (llama_model::load_hparams / src/models/deepseek2.cpp).
void read_mla_hparams(const ArchKeys& k, GgufModelParams& p) {
    const GgufFile& file = k.file;
    p.q_lora_rank = k.in("attention.q_lora_rank", k.opt_int("attention.q_lora_rank", 0), 0);
    p.kv_lora_rank = k.in("attention.kv_lora_rank", file.get_int(k.key("attention.kv_lora_rank")), 1);
    p.key_length_mla = k.in("attention.key_length_mla", file.get_int(k.key("attention.key_length_mla")), 2);
    p.value_length_mla = k.in("attention.value_length_mla", file.get_int(k.key("attention.value_length_mla")), 1);
    p.rope_dimension_count = k.in("rope.dimension_count", file.get_int(k.key("rope.dimension_count")), 2);
    p.expert_group_count = k.in("expert_group_count", k.opt_int("expert_group_count", 1), 1);
    p.expert_group_used_count = k.in("expert_group_used_count", k.opt_int("expert_group_used_count", 1), 1);
    p.expert_gating_func = k.opt_int("expert_gating_func", 0);
    p.leading_dense_block_count = k.in("leading_dense_block_count", k.opt_int("leading_dense_block_count", 0), 0);
    p.expert_shared_count = k.in("expert_shared_count", k.opt_int("expert_shared_count", 0), 0);
    if (const std::string name = k.key("expert_weights_scale"); file.has(name)) p.expert_weights_scale = file.get_float(name);
    if (p.key_length != p.kv_lora_rank + p.rope_dimension_count || p.value_length != p.kv_lora_rank ||
        p.rope_dimension_count >= p.key_length_mla)
        fail(ErrorCode::bad_input, "{}: MLA widths disagree: key_length {} / value_length {} for kv_lora_rank {} + "
             "rope {}, key_length_mla {}", k.fname, p.key_length, p.value_length, p.kv_lora_rank,
             p.rope_dimension_count, p.key_length_mla);
}

// The vocabulary: the tokenizer's token list, else <arch>.vocab_size, else the embedding's rows.
std::int64_t read_vocab_size(const ArchKeys& k) {
    const GgufFile& file = k.file;
    std::int64_t v = 0;
    if (file.has("tokenizer.ggml.tokens")) {
        v = static_cast<std::int64_t>(file.get("tokenizer.ggml.tokens").array_size());
    } else if (file.has(k.key("vocab_size"))) {
        v = file.get_int(k.key("vocab_size"));
    } else if (const auto* te = file.find_tensor("token_embd.weight"); te != nullptr && te->ne.size() == 2) {
        v = te->ne[1];
    }
    return k.positive("vocab_size", v);
}

// What the tensors say: MoE layers, q/k norms, shared experts, tied embeddings; every layer index in range.
void scan_tensor_roles(const ArchKeys& k, GgufModelParams& p) {
    p.moe_layers.assign(static_cast<std::size_t>(p.block_count), false);
    bool has_output = false;
    for (const auto& t : k.file.tensors()) {
        const auto r = gguf_tensor_role(t.name);
        if (!r) continue;
        if (r->role == GgufRole::output) has_output = true;
        if (r->role == GgufRole::attn_q_norm) p.qk_norm = true;
        if (r->role == GgufRole::ffn_gate_shexp || r->role == GgufRole::ffn_up_shexp || r->role == GgufRole::ffn_down_shexp)
            p.shared_expert = true;
        if (r->role == GgufRole::ffn_gate_inp_shexp) p.shared_expert_gate = true;
        if (r->layer >= p.block_count)
            fail(ErrorCode::bad_input, "{}: tensor '{}' belongs to layer {} but block_count is {}", k.fname,
                 printable(t.name), r->layer, p.block_count);
        if (r->role == GgufRole::ffn_gate_inp && r->layer >= 0) p.moe_layers[static_cast<std::size_t>(r->layer)] = true;
    }
    p.tied_embeddings = !has_output;
}

// Sliding windows (llama.cpp: hparams.n_swa, load_swa_pattern). A window without a pattern key takes the
// architecture's default pattern; only gpt-oss has one here (period 2: layer l slides iff l is even).
void read_sliding_windows(const ArchKeys& k, std::int64_t default_period, GgufModelParams& p) {
    const GgufFile& file = k.file;
    p.sliding_window = k.opt_int("attention.sliding_window", 0);
    if (p.sliding_window < 0 || p.sliding_window > (std::int64_t{1} << 31))
        fail(ErrorCode::bad_input, "{}: {} is {}, not a window length", k.fname, k.key("attention.sliding_window"),
             p.sliding_window);
    if (p.sliding_window == 0) return;
    const std::string name = k.key("attention.sliding_window_pattern");
    const GgufValue* v = file.find(name);
    const auto n = static_cast<std::size_t>(p.block_count);
    if (v != nullptr && v->is_array()) {
        if (v->array_type() != GgufType::boolean || v->array_size() != n)
            fail(ErrorCode::bad_input, "{}: {} is an array of {} {}, not {} booleans (one per layer)", k.fname, name,
                 v->array_size(), gguf_type_name(v->array_type()), n);
        p.sliding_layers = file.get_array_bool(name);
        return;
    }
    std::int64_t period = 0;
    if (v != nullptr) {
        period = file.get_int(name);
        if (period < 0 || period > p.block_count)
            fail(ErrorCode::bad_input, "{}: {} is {}, not a period in 0..{}", k.fname, name, period, p.block_count);
    } else if (default_period > 0) {
        period = default_period;
    } else {
        fail(ErrorCode::unsupported, "{}: {} is set but {} has no sliding-window layer pattern here (not modelled for "
             "this architecture)", k.fname, k.key("attention.sliding_window"), k.arch);
    }
    p.sliding_layers.resize(n);
    for (std::size_t l = 0; l < n; ++l)  // llama_hparams::set_swa_pattern (not dense-first)
        p.sliding_layers[l] = period == 0 || static_cast<std::int64_t>(l) % period < period - 1;
}

}  // namespace

GgufModelParams read_gguf_model_params(const GgufFile& file) {
    GgufModelParams p;
    const std::string& fname = file.name();
    p.architecture = file.get_string("general.architecture");
    const std::string& arch = p.architecture;
    const auto families = all_families();
    const auto of_arch = [&](auto&& pred) {
        return std::any_of(families.begin(), families.end(),
                           [&](const Family* f) { return f->gguf_architecture == arch && pred(*f); });
    };
    const auto family = std::find_if(families.begin(), families.end(),
                                     [&](const Family* f) { return f->gguf_architecture == arch; });
    if (family == families.end())
        fail(ErrorCode::unsupported, "{}: architecture '{}' is not supported (supported: {})", fname, printable(arch),
             gguf_supported_architectures());
    const ArchKeys k{file, fname, arch};

    p.block_count = k.positive("block_count", file.get_int(k.key("block_count")));
    p.embedding_length = k.positive("embedding_length", file.get_int(k.key("embedding_length")));
    p.feed_forward_length = k.opt_int("feed_forward_length", 0);
    p.head_count = k.positive("attention.head_count", file.get_int(k.key("attention.head_count")));
    p.head_count_kv = k.positive("attention.head_count_kv", read_head_count_kv(k, p.head_count));
    if (p.head_count % p.head_count_kv != 0)
        fail(ErrorCode::bad_input, "{}: head_count {} is not a multiple of head_count_kv {}", fname, p.head_count,
             p.head_count_kv);
    p.key_length = k.positive("attention.key_length", k.opt_int("attention.key_length", p.embedding_length / p.head_count));
    p.value_length = k.positive("attention.value_length", k.opt_int("attention.value_length", p.key_length));
    if (file.has(k.key("rope.freq_base"))) p.rope_freq_base = file.get_float(k.key("rope.freq_base"));
    p.rms_norm_eps = file.get_float(k.key("attention.layer_norm_rms_epsilon"));
    if (!(p.rms_norm_eps > 0.0) || !(p.rope_freq_base > 0.0))
        fail(ErrorCode::bad_input, "{}: rms epsilon {} / rope base {} must be positive", fname, p.rms_norm_eps,
             p.rope_freq_base);

    p.expert_count = k.opt_int("expert_count", 0);
    p.expert_used_count = k.opt_int("expert_used_count", 0);
    if (p.expert_count == 0 && !of_arch([](const Family& f) { return f.gguf_experts != GgufExperts::with; }))
        fail(ErrorCode::bad_input, "{}: {} has no {}", fname, arch, k.key("expert_count"));
    if (p.expert_count != 0) {
        k.positive("expert_count", p.expert_count);
        if (p.expert_used_count <= 0 || p.expert_used_count > p.expert_count)
            fail(ErrorCode::bad_input, "{}: {} is {}, not in 1..{}", fname, k.key("expert_used_count"), p.expert_used_count,
                 p.expert_count);
        // Mixtral (llama arch) sizes its experts with the dense FFN key.
        p.expert_feed_forward_length =
            k.positive("expert_feed_forward_length", k.opt_int("expert_feed_forward_length", p.feed_forward_length));
    }
    p.expert_shared_feed_forward_length = k.opt_int("expert_shared_feed_forward_length", 0);
    if (of_arch([](const Family& f) { return f.layer == LayerKind::hybrid; })) read_hybrid_hparams(k, p);
    if (of_arch([](const Family& f) { return f.layer == LayerKind::mla; })) read_mla_hparams(k, p);
    p.norm_topk_prob = (*family)->gguf_norm_topk;
    if (const std::string name = k.key("expert_weights_norm"); file.has(name)) p.norm_topk_prob = file.get_bool(name);
    p.vocab_size = read_vocab_size(k);
    scan_tensor_roles(k, p);
    read_sliding_windows(k, (*family)->gguf_swa_period, p);
    return p;
}

}  // namespace kvasir
