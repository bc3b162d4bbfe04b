// GGUF → ModelConfig (model.hpp model_config_from_gguf): what llama.cpp's
// converter wrote for each architecture, read back as the Hugging Face config
// the forward pass computes with — the family, attention and rope, the hybrid
// layers, biases, and each family's feed-forward / router.
#include "kvasir/model/gguf_config.hpp"

#include "kvasir/model/model.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf.hpp"
#include "kvasir/model/gguf_arch.hpp"
#include "kvasir/model/gguf_text.hpp"
#include "kvasir/model/quant.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <string>
#include <string_view>

namespace kvasir {

namespace {

// GGUF stores rms epsilon (and usually rope base) as f32: 1e-6 arrives as
// 9.99999997e-07. The converter wrote float32(decimal literal of config.json),
// so the shortest decimal that round-trips through f32 IS that literal (for
// any literal of ≤ 7 significant digits); reading it back as a double gives
// the value the Hugging Face model computes with. A value that is not an f32
// (the file held an f64) is returned as it is.
double decimal_of_f32(double x) {
    const auto f = static_cast<float>(x);
    if (static_cast<double>(f) != x || !std::isfinite(f)) return x;
    const std::string s = fmt::format("{}", f);  // shortest round-trip representation
    double d = x;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
    return ec == std::errc() && p == s.data() + s.size() && static_cast<float>(d) == f ? d : x;
}

// A GGUF's `<arch>.rope.scaling.*` keys: each float read as the decimal the converter wrote, and the
// two every yarn reader needs — factor (in [1, 1e6]) and original_context_length (default
// context_length) — stored into c.rope_scaling.
struct GgufScaling {
    const GgufFile& file;
    const std::string& a;
    const std::string& path;
    std::string key(std::string_view suffix) const { return fmt::format("{}.rope.scaling.{}", a, suffix); }
    double real(std::string_view suffix, double fallback) const {
        const std::string k = key(suffix);
        if (!file.has(k)) return fallback;
        const double v = file.get_float(k);
        KVASIR_CHECK(std::isfinite(v), ErrorCode::bad_input, "{}: {} is {}, not a finite number", path, k, v);
        return decimal_of_f32(v);
    }
    void read_range(ModelConfig& c) const {
        auto& r = c.rope_scaling;
        r.factor = real("factor", 0.0);
        KVASIR_CHECK(r.factor >= 1.0 && r.factor <= 1e6, ErrorCode::bad_input,
                     "{}: {} is {} (yarn needs a factor in [1, 1e6])", path, key("factor"), r.factor);
        const std::string orig_key = file.has(key("original_context_length")) ? key("original_context_length")
                                                                               : a + ".context_length";
        const std::int64_t orig = file.get_int(orig_key);
        KVASIR_CHECK(orig > 0 && orig <= (std::int64_t{1} << 31), ErrorCode::bad_input,
                     "{}: {} is {}, not a positive length", path, orig_key, orig);
        r.original_max_position_embeddings = static_cast<double>(orig);
    }
};

// A GGUF's yarn rope as llama.cpp computes it for the architectures read
// here (llama_model::load_hparams, llama_context's cparams, ggml's rope):
// rope.scaling.factor and original_context_length (default: context_length)
// from the file; beta_fast 32 and beta_slow 1, extrapolation factor 1 and the
// ramp between ggml_rope_yarn_corr_dims' floored / ceiled correction
// dimensions (transformers' truncate = true) are llama.cpp's own — it reads no
// key for them here; cos/sin scaled by 0.1·ln(factor) + 1 (yarn_attn_factor is
// overwritten by that) times rope.scaling.attn_factor. A file whose yarn keys
// say otherwise than what llama.cpp computes is refused: which of the two is
// meant is not knowable.
void read_gguf_yarn(const GgufFile& file, const std::string& a, const std::string& path, ModelConfig& c) {
    const GgufScaling g{file, a, path};
    const auto key = [&](std::string_view suffix) { return g.key(suffix); };
    const auto real = [&](std::string_view suffix, double fallback) { return g.real(suffix, fallback); };
    g.read_range(c);
    auto& r = c.rope_scaling;
    r.beta_fast = 32.0;
    r.beta_slow = 1.0;
    r.truncate = true;
    const auto mscale = 0.1 * std::log(r.factor) + 1.0;
    const struct {
        std::string_view suffix;
        double llama_cpp;
    } fixed[] = {{"yarn_beta_fast", r.beta_fast}, {"yarn_beta_slow", r.beta_slow}, {"yarn_ext_factor", 1.0},
                 {"yarn_log_multiplier", 0.0}, {"yarn_attn_factor", mscale}};
    for (const auto& f : fixed) {
        const double v = real(f.suffix, f.llama_cpp);
        KVASIR_CHECK(std::abs(v - f.llama_cpp) <= 1e-6 * std::abs(f.llama_cpp), ErrorCode::unsupported,
                     "{}: {} is {}, but llama.cpp computes this architecture's yarn with {} (not modelled)", path,
                     key(f.suffix), v, f.llama_cpp);
    }
    r.attention_factor = mscale * real("attn_factor", 1.0);
}

// deepseek2's yarn as llama.cpp computes it (src/models/deepseek2.cpp, llama_context's cparams): the table
// from factor, original_context_length and yarn_beta_fast / _slow (floored / ceiled range, as transformers'
// truncate), the cos/sin scale cancelled back to 1, and the q·k scale mscale(factor, yarn_log_multiplier)²
// — the converter writes 0.1·mscale_all_dim and the loader divides by 0.1. transformers' model with
// mscale = mscale_all_dim = that value computes the same (cos/sin factor m/m = 1); a checkpoint whose
// mscale differs is converted into that model, which is what a GGUF audit then measures.
void read_gguf_deepseek2_yarn(const GgufFile& file, const std::string& a, const std::string& path, ModelConfig& c) {
    const GgufScaling g{file, a, path};
    const auto key = [&](std::string_view suffix) { return g.key(suffix); };
    const auto real = [&](std::string_view suffix, double fallback) { return g.real(suffix, fallback); };
    g.read_range(c);
    auto& r = c.rope_scaling;
    r.beta_fast = real("yarn_beta_fast", 32.0);
    r.beta_slow = real("yarn_beta_slow", 1.0);
    r.truncate = true;
    const double log_mul = real("yarn_log_multiplier", 0.0) / 0.1;
    KVASIR_CHECK(log_mul > 0.0, ErrorCode::unsupported,
                 "{}: {} is absent or 0 (DeepSeek's mscale_all_dim: every DeepSeek-V3/Kimi-K2 conversion has it; "
                 "llama.cpp's scale without it is not modelled)", path, key("yarn_log_multiplier"));
    KVASIR_CHECK(real("attn_factor", 1.0) == 1.0, ErrorCode::unsupported, "{}: {} other than 1 is not modelled", path,
                 key("attn_factor"));
    r.mscale = r.mscale_all_dim = log_mul;
}

// The family a GGUF's general.architecture names (the family records' gguf_architecture; llama: Mixtral
// when it has experts, dense otherwise).
const Family& gguf_family(const GgufModelParams& p, const std::string& path) {
    const bool moe = p.expert_count > 0;
    for (const Family* f : all_families()) {
        if (f->gguf_architecture != p.architecture) continue;
        if ((f->gguf_experts == GgufExperts::with && !moe) || (f->gguf_experts == GgufExperts::without && moe)) continue;
        return *f;
    }
    fail(ErrorCode::unsupported, "{}: GGUF architecture '{}' {} experts is not supported (supported: {})", path,
         p.architecture, moe ? "with" : "without", gguf_supported_architectures());
}

// Heads, MLA, rope (base, scaling, yarn, llama3 frequency factors), epsilon and context length.
void gguf_attention(const GgufFile& file, const GgufModelParams& p, const std::string& path, ModelConfig& c) {
    const std::string& a = p.architecture;
    c.num_heads = p.head_count;
    c.num_kv_heads = p.head_count_kv;
    c.head_dim = p.key_length;
    if (family_of(c.architecture).layer == LayerKind::mla) {
        // llama.cpp's MQA form of MLA (head_count_kv 1, key/value_length over the latent) is a storage
        // choice: the model is DeepseekV3Attention's, one expanded key and value per head.
        auto& m = c.mla;
        m.q_lora_rank = p.q_lora_rank;
        m.kv_lora_rank = p.kv_lora_rank;
        m.qk_rope_head_dim = p.rope_dimension_count;
        m.qk_nope_head_dim = p.key_length_mla - p.rope_dimension_count;
        m.v_head_dim = p.value_length_mla;
        m.rope_interleave = true;  // the converter keeps HF's interleaved rope pairs (llama.cpp: LLAMA_ROPE_TYPE_NORM)
        c.num_kv_heads = c.num_heads;
        c.head_dim = p.key_length_mla;
    }
    KVASIR_CHECK(c.has_mla() || p.value_length == p.key_length, ErrorCode::unsupported,
                 "{}: {}.attention.value_length {} differs from key_length {} (not modelled)", path, a, p.value_length,
                 p.key_length);
    c.rope_theta = decimal_of_f32(p.rope_freq_base);
    c.rms_norm_eps = decimal_of_f32(p.rms_norm_eps);
    // Rope scaling changes the rotation; the forward pass refuses anything but
    // "default", so carry the file's type through instead of ignoring it.
    if (const std::string k = a + ".rope.scaling.type"; file.has(k)) {
        const std::string& t = file.get_string(k);
        if (t != "none" && !t.empty()) c.rope_type = t;
    }
    if (c.rope_type == "yarn" && c.has_mla())
        read_gguf_deepseek2_yarn(file, a, path, c);
    else if (c.rope_type == "yarn")
        read_gguf_yarn(file, a, path, c);
    c.max_position_embeddings = file.has(a + ".context_length") ? file.get_int(a + ".context_length") : 32768;
    if (const GgufTensor* rf = file.find_tensor("rope_freqs.weight")) {  // llama3 scaling as frequency factors
        KVASIR_CHECK(rf->shape.size() == 1 && rf->shape[0] == p.key_length / 2, ErrorCode::bad_input,
                     "{}: tensor 'rope_freqs.weight' has shape {}, expected [{}] (half the head dim)", path,
                     shape_str(rf->shape), p.key_length / 2);
        const Tensor f = dequantize(*rf);
        for (std::int64_t i = 0; i < f.numel(); ++i) {
            const double v = f.at(i);
            KVASIR_CHECK(std::isfinite(v) && v > 0, ErrorCode::bad_input,
                         "{}: rope_freqs.weight[{}] = {} (a frequency factor must be finite and > 0)", path, i, v);
            c.rope_freq_factors.push_back(v);
        }
    }
    c.qk_norm = p.qk_norm;
}

// qwen3next / qwen35moe as llama.cpp's converter writes them: gated full attention (q_proj's per-head gate,
// q/k norm, rope on rope.dimension_count dims), Gated DeltaNet on the recurrent layers. The converter stores
// every zero-centred RMSNorm weight as f32(1 + w): the file's weights are the scales (norm_weight_offset
// off) — the DeltaNet's gated norm was never offset and is stored as it is.
void gguf_hybrid(const GgufModelParams& p, ModelConfig& c) {
    if (p.recurrent_layers.empty()) return;
    c.attention_output_gate = true;
    c.qk_norm = true;
    c.norm_weight_offset = false;
    c.partial_rotary_factor = static_cast<double>(p.rope_dimension_count) / static_cast<double>(p.key_length);
    c.linear_attention_layers = p.recurrent_layers;
    c.linear.conv_kernel = p.ssm_conv_kernel;
    c.linear.key_head_dim = c.linear.value_head_dim = p.ssm_state_size;
    c.linear.key_heads = p.ssm_group_count;
    c.linear.value_heads = p.ssm_time_step_rank;
}

// The attention biases the file has; a bias of a projection this reader does not carry is refused, never
// silently dropped.
void gguf_biases(const GgufFile& file, const std::string& path, ModelConfig& c) {
    for (const GgufTensor& t : file.tensors()) {
        const auto r = gguf_tensor_role(t.name);
        if (!r || !r->bias) continue;
        if (r->role == GgufRole::attn_q || r->role == GgufRole::attn_k || r->role == GgufRole::attn_v)
            c.attention_bias = true;
        if (r->role == GgufRole::attn_output) c.attention_out_bias = true;
        KVASIR_CHECK(r->role != GgufRole::attn_q_a && r->role != GgufRole::attn_q_b && r->role != GgufRole::attn_kv_a_mqa &&
                         r->role != GgufRole::attn_k_b && r->role != GgufRole::attn_v_b && r->role != GgufRole::attn_qkv &&
                         r->role != GgufRole::attn_gate && r->role != GgufRole::ssm_out && r->role != GgufRole::ssm_ba &&
                         r->role != GgufRole::ssm_beta && r->role != GgufRole::ssm_alpha,
                     ErrorCode::unsupported, "{}: tensor '{}' is a bias this GGUF reader does not model", path,
                     gguf_detail::printable(t.name));
    }
}

}  // namespace

void gguf_softmax_moe_ffn(const GgufFile& file, const GgufModelParams& p, const std::string& /*path*/, ModelConfig& c) {
    c.intermediate_size = p.feed_forward_length;
    for (std::int64_t l = 0; l < c.num_layers; ++l)
        if (!c.moe_layers[static_cast<std::size_t>(l)]) c.mlp_only_layers.push_back(l);
    c.shared_expert_intermediate_size = p.shared_expert ? p.expert_shared_feed_forward_length : 0;
    if (p.shared_expert && c.shared_expert_intermediate_size == 0) {
        // Older converters omit the key: the shared expert's rows say it.
        for (const GgufTensor& t : file.tensors()) {
            const auto r = gguf_tensor_role(t.name);
            if (r && r->role == GgufRole::ffn_up_shexp && !r->bias && t.shape.size() == 2) {
                c.shared_expert_intermediate_size = t.shape[0];
                break;
            }
        }
    }
    c.shared_expert_gate = p.shared_expert_gate;
    c.router.scoring = RouterScoring::softmax;
    c.router.num_experts = p.expert_count;
    c.router.top_k = p.expert_used_count;
    c.router.norm_topk_prob = p.norm_topk_prob;
}

ModelConfig model_config_from_gguf(const GgufFile& file, const std::string& path) {
    const GgufModelParams p = read_gguf_model_params(file);
    ModelConfig c;
    c.source = path;
    const Family& family = gguf_family(p, path);
    c.architecture = family.id;
    c.hidden_size = p.embedding_length;
    c.num_layers = p.block_count;
    gguf_attention(file, p, path, c);
    gguf_hybrid(p, c);
    gguf_biases(file, path, c);
    // V is what the computation uses: the embedding's rows (a tokenizer list may be shorter or padded differently).
    c.vocab_size = p.vocab_size;
    if (const GgufTensor* te = file.find_tensor("token_embd.weight"); te != nullptr && te->shape.size() == 2)
        c.vocab_size = te->shape[0];
    c.tie_word_embeddings = p.tied_embeddings;
    c.moe_layers = p.moe_layers;
    c.moe_intermediate_size = p.expert_feed_forward_length;
    c.sliding_window = p.sliding_window;
    c.sliding_layers = p.sliding_layers;
    family.read_gguf(file, p, path, c);
    validate_model_config(c);
    return c;
}

}  // namespace kvasir
