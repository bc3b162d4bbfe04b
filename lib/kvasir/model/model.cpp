#include "kvasir/model/model.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/immutable_memory.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/family.hpp"
#include "kvasir/model/gguf.hpp"
#include "kvasir/model/gguf_arch.hpp"
#include "kvasir/model/gguf_text.hpp"
#include "kvasir/model/quant.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/model/safetensors_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <sys/mman.h>
#include <unistd.h>

namespace kvasir {

namespace fs = std::filesystem;

namespace {

// Rows [r0, r0 + n) of slice e of a stacked [E, R, C] tensor, as a [n, C]
// view (zero copy; the stack is row-major, so these rows are contiguous).
// Slice e of a stacked [E, ...] tensor, as a view of its [...] (zero copy).
TensorView slice0(const TensorView& stack, std::int64_t e) {
    Shape s(stack.shape.begin() + 1, stack.shape.end());
    const std::size_t bytes = static_cast<std::size_t>(shape_numel(s)) * dtype_size(stack.dtype);
    return TensorView{stack.dtype, static_cast<const std::byte*>(stack.data) + static_cast<std::size_t>(e) * bytes, std::move(s)};
}

TensorView rows_of_slice(const TensorView& stack, std::int64_t e, std::int64_t r0, std::int64_t n) {
    const std::int64_t rows = stack.shape[1], cols = stack.shape[2];
    const std::size_t es = dtype_size(stack.dtype);
    const std::size_t offset = static_cast<std::size_t>((e * rows + r0) * cols) * es;
    return TensorView{stack.dtype, static_cast<const std::byte*>(stack.data) + offset, {n, cols}};
}

// ---------------------------------------------------------------------------
// Helpers shared by both formats
// ---------------------------------------------------------------------------

// Decoder layer of a Hugging Face tensor name ("model.layers.12.mlp..." → 12), −1 otherwise.
// The decoder layer of a Hugging Face tensor name under `tensor_prefix`
// ("model." or the wrapper's "model.language_model."); −1 for the others.
std::int64_t hf_layer_of(std::string_view name, std::string_view tensor_prefix) {
    if (!name.starts_with(tensor_prefix)) return -1;
    name.remove_prefix(tensor_prefix.size());
    constexpr std::string_view prefix = "layers.";
    if (!name.starts_with(prefix)) return -1;
    name.remove_prefix(prefix.size());
    std::int64_t v = -1;
    const auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), v);
    if (ec != std::errc() || p == name.data() || p == name.data() + name.size() || *p != '.') return -1;
    return v;
}

void check_shape(const std::string& file, const std::string& name, const Shape& found, const Shape& expected) {
    KVASIR_CHECK(found == expected, ErrorCode::bad_input, "{}: tensor {} has shape {}, expected {} from the config",
                 file, name, shape_str(found), shape_str(expected));
}

// The family of a GGUF storage type as llama.cpp's CPU backend pairs it with
// activations (its vec_dot_type): F16/BF16 activations for F16/BF16 weights,
// Q8_0/Q8_1 for the 32-value block formats, Q8_K for the k-quants.
WeightOrigin weight_origin(GgmlType type) {
    switch (type) {
        case GgmlType::F16: return WeightOrigin::f16;
        case GgmlType::BF16: return WeightOrigin::bf16;
        case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
        case GgmlType::MXFP4: return WeightOrigin::blocks_q8_0;
        case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
            return WeightOrigin::superblocks_q8_k;
        default: return WeightOrigin::none;
    }
}

[[noreturn]] void missing(const std::string& file, const std::string& name) {
    fail(ErrorCode::bad_input, "{}: missing tensor {}", file, name);
}

// The text hashed by fingerprint(): every field of the config that changes
// what the model computes, in a fixed order and spelling.
std::string canonical_config_text(const ModelConfig& c) {
    std::string s;
    auto line = [&](std::string_view key, const auto& value) { s += fmt::format("{}={}\n", key, value); };
    line("architecture", architecture_name(c.architecture));
    line("hidden_size", c.hidden_size);
    line("num_layers", c.num_layers);
    line("num_heads", c.num_heads);
    line("num_kv_heads", c.num_kv_heads);
    line("head_dim", c.head_dim);
    line("rope_theta", fmt::format("{:.17g}", c.rope_theta));
    line("rope_type", c.rope_type);
    line("rms_norm_eps", fmt::format("{:.17g}", c.rms_norm_eps));
    line("hidden_act", c.hidden_act);
    line("qk_norm", c.qk_norm);
    line("attention_bias", c.attention_bias);
    line("attention_out_bias", c.attention_out_bias);
    line("sliding_window", c.sliding_window);
    line("vocab_size", c.vocab_size);
    line("tie_word_embeddings", c.tie_word_embeddings);
    line("intermediate_size", c.intermediate_size);
    line("moe_intermediate_size", c.moe_intermediate_size);
    line("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
    line("shared_expert_gate", c.shared_expert_gate);
    std::string pattern;
    for (bool m : c.moe_layers) pattern += m ? 'M' : 'D';
    line("layers", pattern);
    line("router.scoring", router_scoring_name(c.router.scoring));
    line("router.num_experts", c.router.num_experts);
    line("router.top_k", c.router.top_k);
    line("router.norm_topk_prob", c.router.norm_topk_prob);
    line("router.score_correction_bias", c.router.score_correction_bias);
    line("router.n_group", c.router.n_group);
    line("router.topk_group", c.router.topk_group);
    line("router.routed_scaling_factor", fmt::format("{:.17g}", c.router.routed_scaling_factor));
    // Hybrid families only (the fingerprints of the others stay what they were).
    if (!c.linear_attention_layers.empty()) {
        std::string types;
        for (bool lin : c.linear_attention_layers) types += lin ? 'L' : 'A';
        line("layer_types", types);
        line("linear.conv_kernel", c.linear.conv_kernel);
        line("linear.key_heads", c.linear.key_heads);
        line("linear.value_heads", c.linear.value_heads);
        line("linear.key_head_dim", c.linear.key_head_dim);
        line("linear.value_head_dim", c.linear.value_head_dim);
        line("partial_rotary_factor", fmt::format("{:.17g}", c.partial_rotary_factor));
        line("attention_output_gate", c.attention_output_gate);
        line("norm_weight_offset", c.norm_weight_offset);
        line("fused_experts", c.fused_experts);
    }
    return s;
}

// 128-bit FNV-1a (offset basis and prime of the FNV specification).
class Fnv1a128 {
public:
    void update(std::span<const std::byte> bytes) {
        for (std::byte b : bytes) {
            h_ ^= static_cast<unsigned __int128>(std::to_integer<unsigned>(b));
            h_ *= kPrime;
        }
    }
    void update(std::string_view s) { update(std::as_bytes(std::span<const char>(s.data(), s.size()))); }
    std::string hex() const {
        return fmt::format("{:016x}{:016x}", static_cast<std::uint64_t>(h_ >> 64), static_cast<std::uint64_t>(h_));
    }

private:
    static constexpr unsigned __int128 kPrime = (static_cast<unsigned __int128>(1) << 88) + 0x13b;
    unsigned __int128 h_ = (static_cast<unsigned __int128>(0x6c62272e07bb0142ULL) << 64) | 0x62b821756295c58dULL;
};

bool aligned_for(const void* p, std::size_t n) { return reinterpret_cast<std::uintptr_t>(p) % n == 0; }

// Rows rows[0], rows[1], … of t viewed as [rows, last dim] (a vector: one element per row), in that order: a
// new tensor of rows.size() rows in t's dtype. Exact data movement.
Tensor gather_rows(const TensorView& t, const std::vector<std::int64_t>& rows) {
    const std::int64_t cols = t.rank() > 1 ? t.shape.back() : 1;
    Shape shape = t.shape;
    shape[0] = static_cast<std::int64_t>(rows.size());
    Tensor out(t.dtype, shape);
    const std::size_t row = static_cast<std::size_t>(cols) * dtype_size(t.dtype);
    for (std::size_t i = 0; i < rows.size(); ++i)
        std::memcpy(static_cast<std::byte*>(out.raw()) + i * row,
                    static_cast<const std::byte*>(t.data) + static_cast<std::size_t>(rows[i]) * row, row);
    return out;
}

// The row (or element) order that puts `heads` blocks of `block` rows from row `first` in HF order — HF
// block h is the file's block src[h] — and leaves the other rows where they are.
std::vector<std::int64_t> head_rows(std::int64_t rows, std::int64_t first, std::int64_t block,
                                    const std::vector<std::int64_t>& src) {
    std::vector<std::int64_t> order(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) order[static_cast<std::size_t>(r)] = r;
    for (std::size_t h = 0; h < src.size(); ++h)
        for (std::int64_t i = 0; i < block; ++i)
            order[static_cast<std::size_t>(first + static_cast<std::int64_t>(h) * block + i)] = first + src[h] * block + i;
    return order;
}

}  // namespace

// ---------------------------------------------------------------------------
// Model
// ---------------------------------------------------------------------------

struct Model::Impl {
    std::string path;
    std::string format;
    ModelConfig cfg;
    RopeLayout rope = RopeLayout::neox;
    std::optional<SafetensorsCheckpoint> st;
    std::optional<GgufFile> gg;
    std::string label;  // FILE in messages: the checkpoint / GGUF path

    mutable std::mutex mu;
    mutable std::map<std::int64_t, std::unique_ptr<LayerWeights>> layers;
    mutable std::map<std::string, TensorView, std::less<>> resolved;  // tensor name → view (each resolved once)
    mutable std::deque<Tensor> owned;                                 // dequantised / realigned copies
    mutable std::uint64_t owned_bytes = 0;
    // The copies never change once made: immutable memory for the model's
    // life, so a device node may keep them resident like mapped weights.
    // Declared after `owned`: unregistered before the copies are freed.
    mutable std::deque<ImmutableRegistration> owned_registrations;
    mutable std::optional<TensorView> embed, final_norm, lm_head;
    bool streams = false;  // streams_weights()

    // --- name lists ---------------------------------------------------------
    std::vector<std::string> gguf_layer_names(std::int64_t l) const;
    // The RMSNorm before the MLP: llama.cpp names it ffn_norm, or post_attention_norm in the architectures
    // whose converter says so (gpt-oss, qwen3next, qwen35moe).
    std::string gguf_post_attention_norm(std::int64_t l) const {
        const std::string p = fmt::format("blk.{}.post_attention_norm.weight", l);
        return gg->find_tensor(p) != nullptr ? p : fmt::format("blk.{}.ffn_norm.weight", l);
    }
    bool gguf_stacked(std::int64_t l) const {
        return gg->find_tensor(fmt::format("blk.{}.ffn_gate_exps.weight", l)) != nullptr;
    }

    // --- resolution (mu held) -------------------------------------------------
    TensorView resolve(const std::string& name, const Shape& expected) const;
    TensorView resolve_gguf(const std::string& name) const;
    LayerWeights load_st(std::int64_t l) const;
    // gpt_oss experts → w.experts in kvasir's layout (owned copies).
    void load_gpt_oss_experts(const LayerTensorNames& n, LayerWeights& w) const;
    // An owned copy, registered immutable for the model's life, with what it
    // was expanded from (cpu:qdot=llamacpp reads it).
    TensorView keep(Tensor t, WeightOrigin origin = WeightOrigin::none) const;
    LayerWeights load_gguf(std::int64_t l) const;
    void load_gguf_mla(std::int64_t l, LayerWeights& w) const;
    void load_gguf_deltanet(std::int64_t l, LayerWeights& w) const;
    void check_present() const;
};

TensorView Model::Impl::resolve_gguf(const std::string& name) const {
    const GgufTensor* t = gg->find_tensor(name);
    if (t == nullptr) missing(label, name);
    std::optional<DType> kind;
    switch (t->type) {
        case GgmlType::F32: kind = DType::f32; break;
        case GgmlType::F16: kind = DType::f16; break;
        case GgmlType::BF16: kind = DType::bf16; break;
        case GgmlType::F64: kind = DType::f64; break;
        default: break;
    }
    if (kind && aligned_for(t->data, dtype_size(*kind))) return TensorView{*kind, t->data, t->shape};
    Tensor copy;
    if (kind == DType::f64) {  // not dequantizable, but a plain float type: realign it
        copy = Tensor(DType::f64, t->shape);
        if (t->nbytes > 0) std::memcpy(copy.raw(), t->data, t->nbytes);
    } else {
        copy = dequantize(*t);  // quantised, or a misaligned F32/F16/BF16 (widened exactly)
    }
    return keep(std::move(copy), weight_origin(t->type));
}

TensorView Model::Impl::resolve(const std::string& name, const Shape& expected) const {
    if (name.empty()) return {};
    // Each name is always asked for with the same expected shape, so the
    // cached (already checked) view is the answer.
    if (auto it = resolved.find(name); it != resolved.end()) return it->second;
    TensorView v;
    std::string file = label;
    if (st) {
        v = st->view(name);
        file = st->shard_of(name);
    } else {
        v = resolve_gguf(name);
    }
    // The qwen2_moe shared-expert gate is [1, H] in HF and a vector [H] in GGUF.
    Shape found = v.shape;
    if (expected.size() == 2 && expected[0] == 1 && found.size() == 1) found = {1, found[0]};
    check_shape(file, name, found, expected);
    KVASIR_CHECK(dtype_is_float(v.dtype), ErrorCode::bad_input, "{}: tensor {} is {}: a model weight must be floating point",
                 file, name, dtype_name(v.dtype));
    v.shape = found;
    resolved.emplace(name, v);
    return v;
}

std::vector<std::string> Model::Impl::gguf_layer_names(std::int64_t l) const {
    const ModelConfig& c = cfg;
    auto w = [&](std::string_view base) { return fmt::format("blk.{}.{}.weight", l, base); };
    auto b = [&](std::string_view base) { return fmt::format("blk.{}.{}.bias", l, base); };
    const bool oss = family_of(c.architecture).experts == ExpertStorage::gate_up_interleaved;
    std::vector<std::string> n{w("attn_norm"), gguf_post_attention_norm(l)};
    if (c.is_linear_attention(l)) {
        n.insert(n.end(), {w("attn_qkv"), w("attn_gate"), w("ssm_conv1d"), fmt::format("blk.{}.ssm_a", l), b("ssm_dt"),
                           w("ssm_norm"), w("ssm_out")});
        if (family_of(c.architecture).gguf_deltanet_tiled)
            n.insert(n.end(), {w("ssm_beta"), w("ssm_alpha")});
        else
            n.push_back(w("ssm_ba"));
    } else if (c.has_mla()) {
        n.insert(n.end(), {w("attn_output"), w("attn_kv_a_mqa"), w("attn_kv_a_norm"), w("attn_k_b"), w("attn_v_b")});
        if (c.mla.q_lora_rank > 0)
            n.insert(n.end(), {w("attn_q_a"), w("attn_q_a_norm"), w("attn_q_b")});
        else
            n.push_back(w("attn_q"));
    } else {
        n.insert(n.end(), {w("attn_output"), w("attn_q"), w("attn_k"), w("attn_v")});
    }
    if (c.attention_bias && !c.has_mla()) n.insert(n.end(), {b("attn_q"), b("attn_k"), b("attn_v")});
    if (c.attention_out_bias) n.push_back(b("attn_output"));
    if (c.qk_norm && !c.is_linear_attention(l)) n.insert(n.end(), {w("attn_q_norm"), w("attn_k_norm")});
    if (c.attention_sinks) n.push_back(w("attn_sinks"));
    if (!c.is_moe(l)) {
        n.insert(n.end(), {w("ffn_gate"), w("ffn_up"), w("ffn_down")});
        return n;
    }
    n.push_back(w("ffn_gate_inp"));
    if (c.router.score_correction_bias) n.push_back(b("exp_probs_b"));
    if (oss) n.insert(n.end(), {b("ffn_gate_inp"), b("ffn_gate_exps"), b("ffn_up_exps"), b("ffn_down_exps")});
    if (gguf_stacked(l)) {
        n.insert(n.end(), {w("ffn_gate_exps"), w("ffn_up_exps"), w("ffn_down_exps")});
    } else {
        for (std::int64_t e = 0; e < c.num_experts(); ++e)
            for (const char* m : {"ffn_gate", "ffn_up", "ffn_down"}) n.push_back(fmt::format("blk.{}.{}.{}.weight", l, m, e));
    }
    if (c.has_shared_expert()) n.insert(n.end(), {w("ffn_gate_shexp"), w("ffn_up_shexp"), w("ffn_down_shexp")});
    if (c.shared_expert_gate) n.push_back(w("ffn_gate_inp_shexp"));
    return n;
}

void Model::Impl::check_present() const {
    if (st) {
        const ModelTensorNames g = model_tensor_names(cfg);
        for (const std::string* n : {&g.embed, &g.final_norm, &g.lm_head})
            if (!st->contains(*n)) missing(label, *n);
        for (std::int64_t l = 0; l < cfg.num_layers; ++l)
            for (const TensorSpec& s : layer_tensor_specs(cfg, l))
                if (!st->contains(s.name)) missing(label, s.name);
        return;
    }
    std::vector<std::string> names{"token_embd.weight", "output_norm.weight"};
    if (!cfg.tie_word_embeddings) names.emplace_back("output.weight");
    for (std::int64_t l = 0; l < cfg.num_layers; ++l) {
        auto more = gguf_layer_names(l);
        names.insert(names.end(), more.begin(), more.end());
    }
    for (const auto& n : names)
        if (gg->find_tensor(n) == nullptr) missing(label, n);
}

TensorView Model::Impl::keep(Tensor t, WeightOrigin origin) const {
    owned_bytes += t.nbytes();
    owned.push_back(std::move(t));
    owned_registrations.emplace_back(owned.back().raw(), owned.back().nbytes(), origin);
    return owned.back().view();
}

// GptOssExperts (transformers 5.24) computes, per expert e, gate_up = x·gate_up_proj[e] + gate_up_proj_bias[e]
// with gate = gate_up[..., 0::2] and up = gate_up[..., 1::2], then (clamped SwiGLU)·down_proj[e] +
// down_proj_bias[e]. kvasir's experts are y = x·Wᵀ with W [out, in]: gate/up rows are columns 2i / 2i+1 of
// gate_up_proj[e] [H, 2I] (rows 2i / 2i+1 of the MXFP4 blocks, which are already [2I, H]), down is
// down_proj[e]ᵀ [H, I] (the MXFP4 down blocks are already [H, I]). The copies are exact: plain weights are
// moved element by element in their own dtype, MXFP4 is expanded to f32 as transformers expands it
// (dequantize_mxfp4_hf).
void Model::Impl::load_gpt_oss_experts(const LayerTensorNames& n, LayerWeights& w) const {
    const ModelConfig& c = cfg;
    const std::int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts();
    const ExpertActivation act{true, c.swiglu_alpha, c.swiglu_limit};
    const TensorView gub = resolve(n.oss_gate_up_bias, {E, 2 * I});
    const TensorView dnb = resolve(n.oss_down_bias, {E, H});
    const std::size_t bes = dtype_size(gub.dtype);
    // Every other element of row e of the [E, 2I] bias: gate (parity 0) or up (parity 1).
    const auto bias_half = [&](std::int64_t e, int parity) {
        Tensor b(gub.dtype, {I});
        const auto* src = static_cast<const std::byte*>(gub.data) + static_cast<std::size_t>(e * 2 * I) * bes;
        for (std::int64_t i = 0; i < I; ++i)
            std::memcpy(static_cast<std::byte*>(b.raw()) + static_cast<std::size_t>(i) * bes,
                        src + static_cast<std::size_t>(2 * i + parity) * bes, bes);
        return keep(std::move(b));
    };
    if (c.mxfp4_experts) {
        // Blocks/scales: U8 (the typed view refuses U8), checked by check_mxfp4_pair: dtype, shapes, sizes.
        const auto pair = [&](const std::string& blocks, const std::string& scales, const Shape& want) {
            return check_mxfp4_pair(st->shard_of(blocks), st->info(blocks), st->raw(blocks), st->info(scales), st->raw(scales),
                                    want);
        };
        const Mxfp4Pair gu = pair(n.oss_gate_up, n.oss_gate_up_scales, {E, 2 * I, H / 32, 16});
        const Mxfp4Pair dn = pair(n.oss_down, n.oss_down_scales, {E, H, I / 32, 16});
        for (std::int64_t e = 0; e < E; ++e) {
            Tensor gate(DType::f32, {I, H}), up(DType::f32, {I, H}), down(DType::f32, {H, I});
            for (std::int64_t r = 0; r < 2 * I; ++r) gu.row(e * 2 * I + r, (r % 2 == 0 ? gate : up).as<float>() + (r / 2) * H);
            for (std::int64_t h = 0; h < H; ++h) dn.row(e * H + h, down.as<float>() + h * I);
            constexpr WeightOrigin mx = WeightOrigin::blocks_q8_0;  // MXFP4: 32-value blocks
            w.experts.push_back({keep(std::move(gate), mx), keep(std::move(up), mx), keep(std::move(down), mx),
                                 bias_half(e, 0), bias_half(e, 1), slice0(dnb, e), act});
        }
        return;
    }
    const TensorView gu = resolve(n.oss_gate_up, {E, H, 2 * I});
    const TensorView dn = resolve(n.oss_down, {E, I, H});
    std::vector<std::int64_t> even, odd;
    for (std::int64_t i = 0; i < I; ++i) {
        even.push_back(2 * i);
        odd.push_back(2 * i + 1);
    }
    for (std::int64_t e = 0; e < E; ++e) {
        // gate_up[e]ᵀ [2I, H]: its even rows are gate's, its odd rows up's.
        const Tensor t = transposed(slice0(gu, e));
        w.experts.push_back({keep(gather_rows(t, even)), keep(gather_rows(t, odd)), keep(transposed(slice0(dn, e))),
                             bias_half(e, 0), bias_half(e, 1), slice0(dnb, e), act});
    }
}

LayerWeights Model::Impl::load_st(std::int64_t l) const {
    const ModelConfig& c = cfg;
    const LayerTensorNames n = layer_tensor_names(c, l);
    const std::int64_t H = c.hidden_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size,
                       F = c.intermediate_size, E = c.num_experts();
    LayerWeights w;
    w.index = l;
    w.moe = c.is_moe(l);
    w.input_norm = resolve(n.input_norm, {H});
    w.post_attention_norm = resolve(n.post_attention_norm, {H});
    w.q_proj = resolve(n.q_proj, {c.attention_output_gate ? 2 * c.q_dim() : c.q_dim(), H});
    w.k_proj = resolve(n.k_proj, {c.kv_dim(), H});
    w.v_proj = resolve(n.v_proj, {c.kv_dim(), H});
    w.o_proj = resolve(n.o_proj, {H, c.num_heads * c.value_head_dim()});
    const auto& mla = c.mla;
    w.q_a_proj = resolve(n.q_a_proj, {mla.q_lora_rank, H});
    w.q_a_norm = resolve(n.q_a_norm, {mla.q_lora_rank});
    w.q_b_proj = resolve(n.q_b_proj, {c.q_dim(), mla.q_lora_rank});
    w.kv_a_proj = resolve(n.kv_a_proj, {mla.kv_lora_rank + mla.qk_rope_head_dim, H});
    w.kv_a_norm = resolve(n.kv_a_norm, {mla.kv_lora_rank});
    w.kv_b_proj = resolve(n.kv_b_proj, {c.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank});
    w.q_a_bias = resolve(n.q_a_bias, {mla.q_lora_rank});
    w.kv_a_bias = resolve(n.kv_a_bias, {mla.kv_lora_rank + mla.qk_rope_head_dim});
    w.q_bias = resolve(n.q_bias, {c.attention_output_gate ? 2 * c.q_dim() : c.q_dim()});
    w.k_bias = resolve(n.k_bias, {c.kv_dim()});
    w.v_bias = resolve(n.v_bias, {c.kv_dim()});
    w.o_bias = resolve(n.o_bias, {H});
    w.q_norm = resolve(n.q_norm, {c.q_norm_dim()});
    w.k_norm = resolve(n.k_norm, {c.k_norm_dim()});
    w.mlp_gate = resolve(n.mlp_gate, {F, H});
    w.mlp_up = resolve(n.mlp_up, {F, H});
    w.mlp_down = resolve(n.mlp_down, {H, F});
    w.router = resolve(n.router, {E, H});
    w.router_bias = resolve(n.router_bias, {E});
    w.router_logit_bias = resolve(n.router_logit_bias, {E});
    w.sinks = resolve(n.sinks, {c.num_heads});
    if (!n.oss_gate_up.empty()) load_gpt_oss_experts(n, w);
    for (const ExpertTensorNames& e : n.experts)
        w.experts.push_back({resolve(e.gate, {I, H}), resolve(e.up, {I, H}), resolve(e.down, {H, I})});
    if (!n.fused_gate_up.empty()) {
        // Expert e's gate is rows [0, I) of gate_up[e], its up rows [I, 2I):
        // views into the one tensor, so reading an expert touches only its bytes.
        const TensorView gu = resolve(n.fused_gate_up, {E, 2 * I, H});
        const TensorView dn = resolve(n.fused_down, {E, H, I});
        for (std::int64_t e = 0; e < E; ++e)
            w.experts.push_back({rows_of_slice(gu, e, 0, I), rows_of_slice(gu, e, I, I), rows_of_slice(dn, e, 0, H)});
    }
    w.linear_attention = c.is_linear_attention(l);
    const auto& la = c.linear;
    w.in_proj_qkv = resolve(n.in_proj_qkv, {la.conv_dim(), H});
    w.in_proj_z = resolve(n.in_proj_z, {la.value_dim(), H});
    w.in_proj_b = resolve(n.in_proj_b, {la.value_heads, H});
    w.in_proj_a = resolve(n.in_proj_a, {la.value_heads, H});
    w.in_proj_qkvz = resolve(n.in_proj_qkvz, {2 * la.key_dim() + 2 * la.value_dim(), H});
    w.in_proj_ba = resolve(n.in_proj_ba, {2 * la.value_heads, H});
    w.conv1d = resolve(n.conv1d, {la.conv_dim(), 1, la.conv_kernel});
    w.dt_bias = resolve(n.dt_bias, {la.value_heads});
    w.a_log = resolve(n.a_log, {la.value_heads});
    w.linear_norm = resolve(n.linear_norm, {la.value_head_dim});
    w.out_proj = resolve(n.out_proj, {H, la.value_dim()});
    w.shared_gate = resolve(n.shared_gate, {Is, H});
    w.shared_up = resolve(n.shared_up, {Is, H});
    w.shared_down = resolve(n.shared_down, {H, Is});
    w.shared_expert_gate = resolve(n.shared_expert_gate, {1, H});
    return w;
}

// deepseek2's attention as llama.cpp's converter stores it: attn_q_a / attn_q_a_norm / attn_q_b (or attn_q),
// attn_kv_a_mqa, attn_kv_a_norm, and kv_b_proj split per head into attn_k_b (numpy [nh, kv_lora, nope]:
// each head's k rows transposed) and attn_v_b ([nh, v, kv_lora]). kv_b_proj [nh·(nope + v), kv_lora] is put
// back together — per head its nope k rows (k_b[h]ᵀ) then its v rows —, an exact copy in the file's dtype
// (dequantised first when the file quantises it).
void Model::Impl::load_gguf_mla(std::int64_t l, LayerWeights& w) const {
    const ModelConfig& c = cfg;
    const auto& m = c.mla;
    const std::int64_t H = c.hidden_size, nh = c.num_heads, r = m.kv_lora_rank, dn = m.qk_nope_head_dim,
                       dv = m.v_head_dim;
    auto w_ = [&](std::string_view base) { return fmt::format("blk.{}.{}.weight", l, base); };
    if (m.q_lora_rank > 0) {
        w.q_a_proj = resolve(w_("attn_q_a"), {m.q_lora_rank, H});
        w.q_a_norm = resolve(w_("attn_q_a_norm"), {m.q_lora_rank});
        w.q_b_proj = resolve(w_("attn_q_b"), {c.q_dim(), m.q_lora_rank});
    } else {
        w.q_proj = resolve(w_("attn_q"), {c.q_dim(), H});
    }
    w.kv_a_proj = resolve(w_("attn_kv_a_mqa"), {r + m.qk_rope_head_dim, H});
    w.kv_a_norm = resolve(w_("attn_kv_a_norm"), {r});
    const TensorView kb = resolve(w_("attn_k_b"), {nh, r, dn});
    const TensorView vb = resolve(w_("attn_v_b"), {nh, dv, r});
    KVASIR_CHECK(kb.dtype == vb.dtype, ErrorCode::bad_input, "{}: blk.{}.attn_k_b is {} but attn_v_b is {}", label, l,
                 dtype_name(kb.dtype), dtype_name(vb.dtype));
    Tensor kv(kb.dtype, {nh * (dn + dv), r});
    const std::size_t es = dtype_size(kb.dtype);
    const auto* pk = static_cast<const std::byte*>(kb.data);
    const auto* pv = static_cast<const std::byte*>(vb.data);
    auto* out = static_cast<std::byte*>(kv.raw());
    for (std::int64_t h = 0; h < nh; ++h) {
        for (std::int64_t i = 0; i < dn; ++i)      // row h·(dn + dv) + i, column j = k_b[h][j][i]
            for (std::int64_t j = 0; j < r; ++j)
                std::memcpy(out + static_cast<std::size_t>((h * (dn + dv) + i) * r + j) * es,
                            pk + static_cast<std::size_t>((h * r + j) * dn + i) * es, es);
        std::memcpy(out + static_cast<std::size_t>((h * (dn + dv) + dn) * r) * es,
                    pv + static_cast<std::size_t>(h * dv * r) * es, static_cast<std::size_t>(dv * r) * es);
    }
    w.kv_b_proj = keep(std::move(kv));
}

// A Gated DeltaNet layer as llama.cpp's converter writes it (qwen3next, qwen35moe), back in the form
// transformers' Qwen3_5MoeGatedDeltaNet computes with (the in_proj_qkv / z / b / a path of the graph):
//   attn_qkv [q (nk·dk) | k | v (nv·dv)], attn_gate = z, ssm_conv1d [C, K] (= conv1d [C, 1, K]), ssm_dt = dt_bias,
//   ssm_norm, ssm_out = out_proj — as they are for qwen3next, whose v heads stay grouped (v head h on key head
//   h / r); qwen35moe's converter TILES them (file head j·nk + g is HF head g·r + j), which every per-v-head
//   tensor is reordered back from (the v rows of attn_qkv and conv1d, z, beta, alpha, ssm_a, dt, out_proj's
//   columns); qwen3next's ssm_ba holds per key head [b (r) | a (r)], split into b and a. ssm_a = −exp(A_log)
//   in f32: A_log = log(−ssm_a) in f64, kept as an f64 vector (each node rounds it to its precision; the
//   f64 oracle's exp(A_log) then is the file's decay rate to an f64 ulp).
void Model::Impl::load_gguf_deltanet(std::int64_t l, LayerWeights& w) const {
    const ModelConfig& c = cfg;
    const auto& la = c.linear;
    const std::int64_t H = c.hidden_size, nk = la.key_heads, nv = la.value_heads, dv = la.value_head_dim,
                       r = nv / nk, C = la.conv_dim(), kd2 = 2 * la.key_dim();
    auto w_ = [&](std::string_view base) { return fmt::format("blk.{}.{}.weight", l, base); };
    const bool tiled = family_of(c.architecture).gguf_deltanet_tiled;
    std::vector<std::int64_t> src(static_cast<std::size_t>(nv));
    for (std::int64_t h = 0; h < nv; ++h) src[static_cast<std::size_t>(h)] = tiled ? (h % r) * nk + h / r : h;
    // Per-v-head rows (from row `first`, `block` rows each) in HF order: a reordered copy when tiled, else the view.
    const auto hf = [&](const TensorView& t, std::int64_t first, std::int64_t block) {
        return tiled ? keep(gather_rows(t, head_rows(t.shape[0], first, block, src))) : t;
    };
    w.in_proj_qkv = hf(resolve(w_("attn_qkv"), {C, H}), kd2, dv);
    w.in_proj_z = hf(resolve(w_("attn_gate"), {la.value_dim(), H}), 0, dv);
    TensorView conv = hf(resolve(w_("ssm_conv1d"), {C, la.conv_kernel}), kd2, dv);
    conv.shape = {C, 1, la.conv_kernel};
    w.conv1d = conv;
    w.dt_bias = hf(resolve(fmt::format("blk.{}.ssm_dt.bias", l), {nv}), 0, 1);
    w.linear_norm = resolve(w_("ssm_norm"), {dv});
    // out_proj [H, vd]: its columns are per v head — reordered as the rows of its transpose.
    const TensorView out = resolve(w_("ssm_out"), {H, la.value_dim()});
    w.out_proj = tiled ? keep(transposed(gather_rows(transposed(out), head_rows(la.value_dim(), 0, dv, src)))) : out;
    if (tiled) {
        w.in_proj_b = hf(resolve(w_("ssm_beta"), {nv, H}), 0, 1);
        w.in_proj_a = hf(resolve(w_("ssm_alpha"), {nv, H}), 0, 1);
    } else {
        const TensorView ba = resolve(w_("ssm_ba"), {2 * nv, H});
        std::vector<std::int64_t> b_rows, a_rows;  // per key head g: rows g·2r + [0, r) are b, + [r, 2r) are a
        for (std::int64_t g = 0; g < nk; ++g)
            for (std::int64_t j = 0; j < r; ++j) {
                b_rows.push_back(g * 2 * r + j);
                a_rows.push_back(g * 2 * r + r + j);
            }
        w.in_proj_b = keep(gather_rows(ba, b_rows));
        w.in_proj_a = keep(gather_rows(ba, a_rows));
    }
    const std::string a_name = fmt::format("blk.{}.ssm_a", l);
    const TensorView a = resolve(a_name, {nv});
    Tensor a_log(DType::f64, {nv});
    for (std::int64_t h = 0; h < nv; ++h) {
        const double v = a.at(src[static_cast<std::size_t>(h)]);
        KVASIR_CHECK(std::isfinite(v) && v < 0.0, ErrorCode::bad_input,
                     "{}: {}[{}] = {} (a DeltaNet decay rate −exp(A_log) must be finite and < 0)", label, a_name,
                     src[static_cast<std::size_t>(h)], v);
        static_cast<double*>(a_log.raw())[h] = std::log(-v);
    }
    w.a_log = keep(std::move(a_log));
}

LayerWeights Model::Impl::load_gguf(std::int64_t l) const {
    const ModelConfig& c = cfg;
    const std::int64_t H = c.hidden_size, D = c.head_dim, I = c.moe_intermediate_size,
                       Is = c.shared_expert_intermediate_size, F = c.intermediate_size, E = c.num_experts();
    auto w_ = [&](std::string_view base) { return fmt::format("blk.{}.{}.weight", l, base); };
    auto b_ = [&](std::string_view base) { return fmt::format("blk.{}.{}.bias", l, base); };
    LayerWeights w;
    w.index = l;
    w.moe = c.is_moe(l);
    const bool oss = family_of(c.architecture).experts == ExpertStorage::gate_up_interleaved;
    w.input_norm = resolve(w_("attn_norm"), {H});
    w.post_attention_norm = resolve(gguf_post_attention_norm(l), {H});
    w.linear_attention = c.is_linear_attention(l);
    if (w.linear_attention) {
        load_gguf_deltanet(l, w);
    } else {
        w.o_proj = resolve(w_("attn_output"), {H, c.num_heads * c.value_head_dim()});
        if (c.has_mla()) {
            load_gguf_mla(l, w);
        } else {
            w.q_proj = resolve(w_("attn_q"), {c.attention_output_gate ? 2 * c.q_dim() : c.q_dim(), H});
            w.k_proj = resolve(w_("attn_k"), {c.kv_dim(), H});
            w.v_proj = resolve(w_("attn_v"), {c.kv_dim(), H});
        }
        if (c.attention_bias && !c.has_mla()) {
            w.q_bias = resolve(b_("attn_q"), {c.q_dim()});
            w.k_bias = resolve(b_("attn_k"), {c.kv_dim()});
            w.v_bias = resolve(b_("attn_v"), {c.kv_dim()});
        }
        if (c.attention_out_bias) w.o_bias = resolve(b_("attn_output"), {H});
        if (c.qk_norm) {
            w.q_norm = resolve(w_("attn_q_norm"), {D});
            w.k_norm = resolve(w_("attn_k_norm"), {D});
        }
    }
    if (c.attention_sinks) w.sinks = resolve(w_("attn_sinks"), {c.num_heads});
    if (!w.moe) {
        w.mlp_gate = resolve(w_("ffn_gate"), {F, H});
        w.mlp_up = resolve(w_("ffn_up"), {F, H});
        w.mlp_down = resolve(w_("ffn_down"), {H, F});
        return w;
    }
    w.router = resolve(w_("ffn_gate_inp"), {E, H});
    if (c.router.score_correction_bias) w.router_bias = resolve(b_("exp_probs_b"), {E});
    if (gguf_stacked(l)) {
        // One contiguous [E, rows, cols] block per matrix: expert e is the e-th slice.
        const TensorView g = resolve(w_("ffn_gate_exps"), {E, I, H});
        const TensorView u = resolve(w_("ffn_up_exps"), {E, I, H});
        const TensorView d = resolve(w_("ffn_down_exps"), {E, H, I});
        auto slice = [](const TensorView& stack, std::int64_t e) {
            const std::size_t bytes = static_cast<std::size_t>(stack.shape[1] * stack.shape[2]) * dtype_size(stack.dtype);
            return TensorView{stack.dtype, static_cast<const std::byte*>(stack.data) + static_cast<std::size_t>(e) * bytes,
                              {stack.shape[1], stack.shape[2]}};
        };
        for (std::int64_t e = 0; e < E; ++e) w.experts.push_back({slice(g, e), slice(u, e), slice(d, e)});
        if (oss) {  // gpt-oss: the router's logit bias, a bias per expert matrix, the clamped SwiGLU
            w.router_logit_bias = resolve(b_("ffn_gate_inp"), {E});
            const TensorView gb = resolve(b_("ffn_gate_exps"), {E, I});
            const TensorView ub = resolve(b_("ffn_up_exps"), {E, I});
            const TensorView db = resolve(b_("ffn_down_exps"), {E, H});
            const ExpertActivation act{true, c.swiglu_alpha, c.swiglu_limit};
            for (std::int64_t e = 0; e < E; ++e) {
                ExpertWeights& x = w.experts[static_cast<std::size_t>(e)];
                x.gate_bias = slice0(gb, e);
                x.up_bias = slice0(ub, e);
                x.down_bias = slice0(db, e);
                x.activation = act;
            }
        }
    } else {
        for (std::int64_t e = 0; e < E; ++e)
            w.experts.push_back({resolve(fmt::format("blk.{}.ffn_gate.{}.weight", l, e), {I, H}),
                                 resolve(fmt::format("blk.{}.ffn_up.{}.weight", l, e), {I, H}),
                                 resolve(fmt::format("blk.{}.ffn_down.{}.weight", l, e), {H, I})});
    }
    if (c.has_shared_expert()) {
        w.shared_gate = resolve(w_("ffn_gate_shexp"), {Is, H});
        w.shared_up = resolve(w_("ffn_up_shexp"), {Is, H});
        w.shared_down = resolve(w_("ffn_down_shexp"), {H, Is});
    }
    if (c.shared_expert_gate) w.shared_expert_gate = resolve(w_("ffn_gate_inp_shexp"), {1, H});
    return w;
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

namespace {
// Model::streams_weights(): the files' bytes against half the physical memory, unless KVASIR_STREAM_WEIGHTS says.
bool decide_streaming(const std::vector<std::string>& files) {
    if (const char* env = std::getenv("KVASIR_STREAM_WEIGHTS"); env != nullptr && *env != '\0')
        return std::string_view(env) != "0";
    std::uint64_t bytes = 0;
    std::error_code ec;
    for (const std::string& f : files) {
        const auto size = fs::file_size(f, ec);
        if (!ec) bytes += size;
    }
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 && bytes > static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2;
}
}  // namespace

Model Model::open(const std::string& path) {
    auto impl = std::make_unique<Impl>();
    impl->path = path;
    std::error_code ec;
    // Anything but a regular file or a folder (a FIFO, a device, a symlink
    // loop) is refused by name here, before anything is opened.
    const bool is_dir = check_input_path(path, InputKind::file_or_directory);

    bool is_gguf = false;
    if (!is_dir) {
        char magic[4] = {0, 0, 0, 0};
        const int fd = open_input_file(path);
        is_gguf = ::read(fd, magic, 4) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
        ::close(fd);
    }

    if (is_gguf) {
        impl->format = "gguf";
        impl->label = path;
        impl->gg.emplace(GgufFile::open(path));
        impl->cfg = model_config_from_gguf(*impl->gg, path);
        // llama.cpp permutes q/k of llama-architecture files for adjacent-pair rope.
        impl->rope = family_of(impl->cfg.architecture).gguf_rope_permuted ? RopeLayout::normal : RopeLayout::neox;
    } else if (is_dir) {
        impl->format = "safetensors";
        impl->cfg = load_model_config(path);
        impl->st.emplace(SafetensorsCheckpoint::open(path));
        impl->label = impl->st->sharded() ? (fs::path(path) / "model.safetensors.index.json").string()
                                          : impl->st->shard_files().front();
    } else if (fs::path(path).extension() == ".safetensors") {
        impl->format = "safetensors";
        const fs::path dir = fs::absolute(path).parent_path();
        impl->cfg = load_model_config(dir.string());
        // A shard of a sharded checkpoint stands for the whole checkpoint.
        if (fs::is_regular_file(dir / "model.safetensors.index.json", ec)) {
            auto whole = SafetensorsCheckpoint::open((dir / "model.safetensors.index.json").string());
            const bool member = std::any_of(whole.shard_files().begin(), whole.shard_files().end(),
                                            [&](const std::string& s) { return fs::equivalent(s, path, ec); });
            if (member) {
                impl->label = (dir / "model.safetensors.index.json").string();
                impl->st.emplace(std::move(whole));
            }
        }
        if (!impl->st) {
            impl->st.emplace(SafetensorsCheckpoint::open(path));
            impl->label = path;
        }
    } else {
        fail(ErrorCode::bad_input, "{}: not a model (expected a folder with config.json, a .safetensors file in such "
             "a folder, or a .gguf file)", path);
    }
    if (impl->st) {
        // Experts fused per layer (transformers 5's in-memory layout, as some
        // Qwen3.5 checkpoints store them) or one tensor per expert.
        ModelConfig& c = impl->cfg;
        for (std::int64_t l = 0; l < c.num_layers; ++l)
            if (c.is_moe(l)) {
                const std::string x = fmt::format("{}layers.{}.mlp.experts.", c.tensor_prefix, l);
                if (family_of(c.architecture).experts == ExpertStorage::gate_up_interleaved) {
                    // MXFP4 (the published checkpoints) or plain (as transformers saves a dequantised model).
                    c.mxfp4_experts = impl->st->contains(x + "gate_up_proj_blocks");
                    KVASIR_CHECK(!c.mxfp4_experts || (c.hidden_size % 32 == 0 && c.moe_intermediate_size % 32 == 0),
                                 ErrorCode::bad_input, "{}: MXFP4 experts need hidden_size ({}) and intermediate_size ({}) "
                                 "in whole blocks of 32", impl->label, c.hidden_size, c.moe_intermediate_size);
                } else {
                    c.fused_experts = impl->st->contains(x + "gate_up_proj");
                }
                break;
            }
    }
    impl->check_present();
    impl->streams = decide_streaming(impl->st ? impl->st->shard_files() : std::vector<std::string>{path});
    return Model(std::move(impl));
}

bool Model::streams_weights() const { return impl_->streams; }

void Model::will_read(const TensorView& v) const {
    if (!impl_->streams || v.data == nullptr) return;
    const std::size_t n = static_cast<std::size_t>(v.numel()) * dtype_size(v.dtype);
    if (n == 0) return;
    static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const auto p = reinterpret_cast<std::uintptr_t>(v.data);
    const auto begin = p & ~(page - 1);
    (void)madvise(reinterpret_cast<void*>(begin), p + n - begin, MADV_WILLNEED);  // an owned copy: nothing to read
}

void Model::will_read_layer(std::int64_t l) const {
    if (!impl_->streams) return;
    for (const auto& [view, name] : layer(l).named_views()) will_read(*view);
}

const ModelConfig& Model::config() const { return impl_->cfg; }
const std::string& Model::path() const { return impl_->path; }
std::string Model::format() const { return impl_->format; }
RopeLayout Model::rope_layout() const { return impl_->rope; }
const SafetensorsCheckpoint* Model::checkpoint() const { return impl_->st ? &*impl_->st : nullptr; }
const GgufFile* Model::gguf() const { return impl_->gg ? &*impl_->gg : nullptr; }

const LayerWeights& Model::layer(std::int64_t l) const {
    const Impl& m = *impl_;
    KVASIR_CHECK(l >= 0 && l < m.cfg.num_layers, ErrorCode::bad_input, "{}: layer {} does not exist (the model has {} "
                 "layers)", m.path, l, m.cfg.num_layers);
    std::lock_guard lock(m.mu);
    if (auto it = m.layers.find(l); it != m.layers.end()) return *it->second;
    auto w = std::make_unique<LayerWeights>(m.st ? m.load_st(l) : m.load_gguf(l));
    return *m.layers.emplace(l, std::move(w)).first->second;
}

TensorView Model::embed() const {
    const Impl& m = *impl_;
    std::lock_guard lock(m.mu);
    if (!m.embed)
        m.embed = m.resolve(m.st ? model_tensor_names(m.cfg).embed : "token_embd.weight",
                            {m.cfg.vocab_size, m.cfg.hidden_size});
    return *m.embed;
}

TensorView Model::final_norm() const {
    const Impl& m = *impl_;
    std::lock_guard lock(m.mu);
    if (!m.final_norm)
        m.final_norm = m.resolve(m.st ? model_tensor_names(m.cfg).final_norm : "output_norm.weight", {m.cfg.hidden_size});
    return *m.final_norm;
}

TensorView Model::lm_head() const {
    if (impl_->cfg.tie_word_embeddings) return embed();
    const Impl& m = *impl_;
    std::lock_guard lock(m.mu);
    if (!m.lm_head)
        m.lm_head = m.resolve(m.st ? model_tensor_names(m.cfg).lm_head : "output.weight",
                              {m.cfg.vocab_size, m.cfg.hidden_size});
    return *m.lm_head;
}

namespace {

volatile unsigned touch_sink = 0;


// Reads `v`'s bytes: read-ahead advice for its pages, then one load per page.
std::uint64_t read_through(const TensorView& v) {
    if (!present(v)) return 0;
    const std::size_t n = static_cast<std::size_t>(v.numel()) * dtype_size(v.dtype);
    if (n == 0) return 0;
    static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const auto* p = static_cast<const unsigned char*>(v.data);
    const auto begin = reinterpret_cast<std::uintptr_t>(p) & ~(page - 1);
    // Advice only: an owned (dequantised) tensor or a refusal changes nothing.
    void* range = reinterpret_cast<void*>(begin);
    const std::size_t length = reinterpret_cast<std::uintptr_t>(p) + n - begin;
    (void)madvise(range, length, MADV_SEQUENTIAL);
    (void)madvise(range, length, MADV_WILLNEED);
    unsigned sum = 0;
    for (std::size_t i = 0; i < n; i += page) sum += p[i];
    sum += p[n - 1];
    (void)madvise(range, length, MADV_RANDOM);
    touch_sink = sum;  // the loads must happen
    return n;
}

}  // namespace

std::vector<std::pair<const TensorView*, const char*>> LayerWeights::named_views() const {
    return {{&input_norm, "input_layernorm"},   {&post_attention_norm, "post_attention_layernorm"},
            {&q_proj, "q_proj"},                 {&k_proj, "k_proj"},
            {&v_proj, "v_proj"},                 {&o_proj, "o_proj"},
            {&q_bias, "q_proj bias"},            {&k_bias, "k_proj bias"},
            {&v_bias, "v_proj bias"},            {&o_bias, "o_proj bias"},
            {&q_norm, "q_norm"},                 {&k_norm, "k_norm"},
            {&q_a_proj, "q_a_proj"},             {&q_a_norm, "q_a_layernorm"},
            {&q_b_proj, "q_b_proj"},             {&kv_a_proj, "kv_a_proj_with_mqa"},
            {&kv_a_norm, "kv_a_layernorm"},      {&kv_b_proj, "kv_b_proj"},
            {&q_a_bias, "q_a_proj bias"},        {&kv_a_bias, "kv_a_proj_with_mqa bias"},
            {&mlp_gate, "mlp gate_proj"},        {&mlp_up, "mlp up_proj"},
            {&mlp_down, "mlp down_proj"},        {&router, "router (gate)"},
            {&router_bias, "router bias"},       {&router_logit_bias, "router logit bias"},
            {&sinks, "attention sinks"},         {&shared_gate, "shared expert gate_proj"},
            {&shared_up, "shared expert up_proj"}, {&shared_down, "shared expert down_proj"},
            {&shared_expert_gate, "shared_expert_gate"},
            {&in_proj_qkv, "linear_attn in_proj_qkv"}, {&in_proj_z, "linear_attn in_proj_z"},
            {&in_proj_b, "linear_attn in_proj_b"}, {&in_proj_a, "linear_attn in_proj_a"},
            {&in_proj_qkvz, "linear_attn in_proj_qkvz"}, {&in_proj_ba, "linear_attn in_proj_ba"},
            {&conv1d, "linear_attn conv1d"},     {&dt_bias, "linear_attn dt_bias"},
            {&a_log, "linear_attn A_log"},       {&linear_norm, "linear_attn norm"},
            {&out_proj, "linear_attn out_proj"}};
}

std::uint64_t Model::load_layer(std::int64_t l) const {
    const LayerWeights& w = layer(l);
    std::uint64_t bytes = 0;
    for (const auto& [v, name] : w.named_views()) bytes += read_through(*v);
    for (const ExpertWeights& e : w.experts) bytes += read_through(e.gate) + read_through(e.up) + read_through(e.down);
    return bytes;
}

std::uint64_t Model::load_globals() const {
    std::uint64_t bytes = read_through(embed()) + read_through(final_norm());
    if (lm_head().data != embed().data) bytes += read_through(lm_head());
    return bytes;
}

std::uint64_t Model::layer_bytes(std::int64_t l) const {
    const Impl& m = *impl_;
    KVASIR_CHECK(l >= 0 && l < m.cfg.num_layers, ErrorCode::bad_input, "{}: layer {} does not exist (the model has {} "
                 "layers)", m.path, l, m.cfg.num_layers);
    if (m.st) {
        std::vector<std::string> names;
        for (const TensorSpec& s : layer_tensor_specs(m.cfg, l)) names.push_back(s.name);
        return m.st->bytes_of(names);
    }
    std::uint64_t total = 0;
    for (const GgufTensor& t : m.gg->tensors()) {
        const auto r = gguf_tensor_role(t.name);
        if (r && r->layer == l) total += t.nbytes;
    }
    return total;
}

void Model::check_tensor_shapes() const {
    const Impl& m = *impl_;
    if (!m.st) return;  // GGUF: the config is read from the same file, each tensor checked as it is loaded
    const auto check = [&](const TensorSpec& s) {
        const SafetensorsTensorInfo& info = m.st->info(s.name);
        check_shape(m.st->shard_of(s.name), s.name, info.shape, s.shape);
        const auto d = info.kvasir_dtype();
        KVASIR_CHECK(!d || dtype_is_float(*d), ErrorCode::bad_input, "{}: tensor {} is {}: a model weight must be floating point",
                     m.st->shard_of(s.name), s.name, safetensors_dtype_name(info.dtype));
    };
    for (const TensorSpec& s : model_tensor_specs(m.cfg)) check(s);
    for (std::int64_t l = 0; l < m.cfg.num_layers; ++l)
        for (const TensorSpec& s : layer_tensor_specs(m.cfg, l)) check(s);
}

std::vector<ModelTensorEntry> Model::tensor_table() const {
    const Impl& m = *impl_;
    std::vector<ModelTensorEntry> out;
    if (m.st) {
        for (const std::string& name : m.st->names()) {
            const SafetensorsTensorInfo& info = m.st->info(name);
            out.push_back({name, safetensors_dtype_name(info.dtype), info.shape, info.nbytes,
                           hf_layer_of(name, m.cfg.tensor_prefix)});
        }
    } else {
        for (const GgufTensor& t : m.gg->tensors()) {
            const auto r = gguf_tensor_role(t.name);
            out.push_back({t.name, std::string(ggml_type_name(t.type)), t.shape, t.nbytes, r ? r->layer : -1});
        }
        std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    }
    return out;
}

std::string Model::fingerprint() const {
    Fnv1a128 h;
    h.update("kvasir-model v1\n");
    h.update(impl_->format + "\n");
    h.update(canonical_config_text(impl_->cfg));
    for (const ModelTensorEntry& e : tensor_table()) h.update(fmt::format("{} {} {}\n", e.name, e.dtype, shape_str(e.shape)));
    const TensorView norm = final_norm();
    h.update(std::span<const std::byte>(static_cast<const std::byte*>(norm.data),
                                        static_cast<std::size_t>(norm.numel()) * dtype_size(norm.dtype)));
    return h.hex();
}

std::vector<std::int64_t> Model::loaded_layers() const {
    std::lock_guard lock(impl_->mu);
    std::vector<std::int64_t> out;
    for (const auto& [l, _] : impl_->layers) out.push_back(l);
    return out;
}

std::uint64_t Model::owned_bytes() const {
    std::lock_guard lock(impl_->mu);
    return impl_->owned_bytes;
}

}  // namespace kvasir
