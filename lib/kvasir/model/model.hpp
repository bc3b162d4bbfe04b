// kvasir::Model — one model, whatever file it came in: a Hugging Face folder
// (config.json + model.safetensors, or sharded model-0000N-of-0000M.safetensors
// with model.safetensors.index.json), a .safetensors file inside such a
// folder, or a llama.cpp .gguf file. It hands out the weights of each layer
// as TensorViews named by their role (q_proj, experts[e].gate, ...), so the
// forward pass and the layer-level steps never see file formats or tensor
// names.
//
// Laziness — the contract that lets a 240 GB checkpoint be audited one layer
// at a time:
//  * open() reads config.json (or the GGUF header), the safetensors header of
//    a single file (or the index of a sharded checkpoint: no shard is mapped)
//    and checks that every tensor the config implies is PRESENT (names only).
//  * layer(l) resolves layer l's tensors on first use and caches the result:
//    it maps only the shard(s) holding layer l, checks each tensor's shape
//    against the config, and returns views. safetensors views (and GGUF
//    F32/F16/BF16/F64 tensors) are zero-copy pointers into the mapping: no
//    byte of weight data is read until a kernel reads it (view() advises the
//    kernel to read exactly that tensor's pages ahead, nothing else).
//  * GGUF block-quantised tensors (Q8_0, Q4_K, Q6_K) cannot be viewed as
//    floats: on first use they are dequantised (kvasir::dequantize, bit-exact
//    against ggml and the gguf package) into f32 Tensors owned by the Model,
//    so their cost is paid once per layer and only for layers asked for.
//  * embed(), final_norm(), lm_head() are resolved lazily in the same way.
// Everything returned by reference or as a view stays valid for the Model's
// lifetime, moves included. All const methods are thread-safe (the lazy
// caches are guarded by a mutex).
//
// Shapes are the Hugging Face (PyTorch Linear) ones whatever the file:
// [out, in] matrices, experts gate/up [I, H] and down [H, I]. A GGUF expert
// stack (ffn_{gate,up,down}_exps, row-major [E, I, H] / [E, H, I]) is one
// contiguous block, and expert e is the view of its e-th [I, H] slice (for a
// quantised stack: of the dequantised stack). Legacy per-expert GGUF tensors
// (blk.N.ffn_gate.E.weight) are accepted too. The qwen2_moe shared-expert
// gate is always presented as [1, H] (GGUF stores it as a vector [H]).
//
// RoPE layout. Hugging Face checkpoints of every supported architecture use
// the NEOX (rotate-halves) layout. llama.cpp's converter permutes the rows of
// attn_q/attn_k of `llama`-architecture GGUFs (Mixtral) so that llama.cpp can
// rotate *adjacent* pairs; applying the normal (GPT-J) layout to those
// permuted weights is exactly the NEOX rotation of the original ones (the q·k
// dot products see the same pairs). qwen2moe/qwen3moe GGUFs are not permuted
// and stay NEOX. rope_layout() says which one the weights of this file need.
//
// Errors (Error(bad_input), one line naming the file):
//   "PATH: missing tensor NAME"                                  (at open())
//   "PATH: tensor NAME has shape [a, b], expected [c, d] from the config" (at first use)
// plus every error of the underlying readers (malformed files, unsupported
// dtypes, unknown architectures).
#pragma once

#include "kvasir/core/model_types.hpp"  // ExpertWeights, RopeLayout
#include "kvasir/core/tensor.hpp"
#include "kvasir/model/config.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvasir {

class SafetensorsCheckpoint;
class GgufFile;

// A weight slot that the architecture does not have (no q bias, no shared
// expert, ...) is a default TensorView: data == nullptr, empty shape.
inline bool present(const TensorView& v) noexcept { return v.data != nullptr || v.device != nullptr; }

// The weights of one decoder layer, by role. Shapes (H hidden, D head_dim,
// nh/nkv heads, I expert width, Is shared-expert width, F dense width, E experts):
struct LayerWeights {
    std::int64_t index = 0;
    bool moe = false;               // config().is_moe(index)
    TensorView input_norm;          // [H]  RMSNorm before attention
    TensorView post_attention_norm; // [H]  RMSNorm before the MLP / MoE block
    TensorView q_proj, k_proj, v_proj, o_proj;  // [nh·D, H], [nkv·D, H], [nkv·D, H], [H, nh·D]
    TensorView q_bias, k_bias, v_bias;          // [nh·D], [nkv·D], [nkv·D] (qwen2_moe) or absent
    TensorView o_bias;                          // [H] (qwen3_moe attention_bias) or absent
    TensorView q_norm, k_norm;                  // [D] per-head RMSNorm (qwen3_moe) or absent
    // MLA (deepseek_v3; config.hpp ModelConfig::Mla): q_a/q_b (or q_proj alone), kv_a (with the shared
    // rope key), the two latent RMSNorms and kv_b; o_proj [H, nh·v_head_dim]. Absent otherwise.
    TensorView q_a_proj, q_a_norm, q_b_proj, kv_a_proj, kv_a_norm, kv_b_proj;
    TensorView q_a_bias, kv_a_bias;  // attention_bias only
    // Dense MLP (moe == false): down(silu(gate x) · up x)
    TensorView mlp_gate, mlp_up;                // [F, H]
    TensorView mlp_down;                        // [H, F]
    // MoE block (moe == true)
    TensorView router;                          // [E, H]
    TensorView router_bias;                     // [E] DeepSeek e_score_correction_bias, else absent
    TensorView router_logit_bias;               // [E] gpt_oss: added to the router logits, else absent
    TensorView sinks;                           // [nh] gpt_oss attention sinks, else absent
    std::vector<ExpertWeights> experts;         // E entries: gate/up [I, H], down [H, I]
    TensorView shared_gate, shared_up;          // [Is, H] or absent
    TensorView shared_down;                     // [H, Is] or absent
    TensorView shared_expert_gate;              // [1, H] (qwen2_moe) or absent
    // Gated DeltaNet (linear_attention layers of qwen3_5_moe / qwen3_next;
    // the attention views above are then absent). Shapes: layer_tensor_specs.
    bool linear_attention = false;
    TensorView in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;  // qwen3_5_moe
    TensorView in_proj_qkvz, in_proj_ba;                      // qwen3_next
    TensorView conv1d, dt_bias, a_log, linear_norm, out_proj;

    // Every view but the experts', with a short name ("q_proj", "conv1d",
    // ...), absent ones included: the one list of what a layer holds.
    std::vector<std::pair<const TensorView*, const char*>> named_views() const;
};

// One row of `inspect`'s tensor table, in the file's own terms.
struct ModelTensorEntry {
    std::string name;       // as stored in the file
    std::string dtype;      // the file's spelling: "F32", "BF16", "Q8_0", ...
    Shape shape;            // row-major
    std::uint64_t bytes = 0;  // bytes occupied in the file
    std::int64_t layer = -1;  // decoder layer, −1 for embed / final norm / lm_head / others
};

class Model {
public:
    // A folder holding config.json, a .safetensors file in such a folder (a
    // shard listed in the folder's index opens the whole sharded checkpoint),
    // or a .gguf file (recognised by its magic, whatever the extension).
    // GGUF: the ModelConfig is built from read_gguf_model_params (qwen2moe →
    // qwen2_moe, qwen3moe → qwen3_moe, llama with experts → mixtral) and
    // checked with validate_model_config; its `source` is the GGUF path.
    static Model open(const std::string& path);

    Model(Model&&) noexcept;
    Model& operator=(Model&&) noexcept;
    ~Model();

    const ModelConfig& config() const;
    const std::string& path() const;   // as given to open()
    std::string format() const;        // "safetensors" or "gguf"
    RopeLayout rope_layout() const;    // see the header comment

    // Layer l's weights, resolved on first use (see "Laziness"). Throws
    // Error(bad_input) for l outside [0, num_layers) or a shape mismatch.
    const LayerWeights& layer(std::int64_t l) const;
    TensorView embed() const;       // [V, H]
    TensorView final_norm() const;  // [H]
    TensorView lm_head() const;     // [V, H]; the embedding itself when tied

    // Read every byte of layer l's weights once (resolving the layer first),
    // so later work finds them in memory: the explicit "load" phase that
    // `matrix` and `audit` time apart from computing. Pages are asked for
    // with MADV_WILLNEED (read-ahead), then touched. Returns the bytes read.
    std::uint64_t load_layer(std::int64_t l) const;
    // The same for the embedding, the final norm and the lm_head.
    std::uint64_t load_globals() const;

    // Streaming weights (issue #42). A checkpoint whose files exceed half of
    // this machine's physical memory cannot stay in the page cache: every
    // pass reads its weights from disk again, and through a MADV_RANDOM
    // mapping each 4 KiB page would be one synchronous fault. streams_weights()
    // says the Model was opened so (KVASIR_STREAM_WEIGHTS=1/0 forces it on or
    // off); will_read() then asks the kernel to read a view's pages ahead
    // (MADV_WILLNEED: asynchronous, the whole range in one request) right
    // before a kernel walks them, and will_read_layer() does so for every view
    // of layer l but its experts (the forward pass asks for the experts its
    // routing chose). Advice only: the bits never change; a no-op when the
    // Model does not stream. Memory stays bounded either way: mapped pages are
    // page cache, which the kernel evicts (core/process_memory.hpp).
    bool streams_weights() const;
    void will_read(const TensorView& v) const;
    void will_read_layer(std::int64_t l) const;

    // Bytes layer l occupies in the file(s) (maps the shards holding it, reads
    // no tensor data).
    std::uint64_t layer_bytes(std::int64_t l) const;
    // Every tensor of the file(s), sorted by name, for `inspect`. Maps every
    // shard's header (reads no tensor data).
    std::vector<ModelTensorEntry> tensor_table() const;
    // Every tensor the config implies has the shape it implies, read from the
    // headers (every shard's is mapped, no data read): Error(bad_input) naming
    // the file, the tensor and both shapes. open() checks only that the names
    // exist (it maps no shard); a step checks each tensor as it loads it.
    void check_tensor_shapes() const;

    // Identity of the model, for captures: 32 lowercase hex digits of the
    // 128-bit FNV-1a hash of a canonical text made of
    //   "kvasir-model v1", the format ("safetensors"/"gguf"),
    //   every ModelConfig field that changes the computation (architecture,
    //     sizes, eps, rope, router, MoE/dense layer pattern, ...; not `source`
    //     and not config.json formatting or unrelated keys),
    //   one line "name dtype shape" per tensor, sorted by name,
    //   the bytes of the final-norm weight ([H] values: a fine-tune of the
    //     same base model changes them while keeping every shape).
    // FNV-1a is not a cryptographic hash: it tells models apart, it does not
    // defend against forgery (a capture is trusted data anyway). The same
    // weights as safetensors and as GGUF have different fingerprints (names
    // and dtypes differ). Computing it maps every shard header and reads H
    // values of the final norm.
    std::string fingerprint() const;

    // Introspection for tests and `inspect`: the safetensors checkpoint (null
    // for GGUF), the GGUF file (null for safetensors), the layers resolved so
    // far, and the bytes of dequantised/copied tensors the Model owns.
    const SafetensorsCheckpoint* checkpoint() const;
    const GgufFile* gguf() const;
    std::vector<std::int64_t> loaded_layers() const;
    std::uint64_t owned_bytes() const;

private:
    struct Impl;
    explicit Model(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// The ModelConfig a GGUF file describes (what Model::open uses); `path` is
// stored as its source. GGUF holds rms epsilon and rope base as f32 (1e-6
// becomes 9.99999997e-07): they are read back as the shortest decimal that
// round-trips through f32 — the config.json literal the converter started
// from — so a GGUF model computes with the same epsilon as its Hugging Face
// original (an f64 forward would otherwise differ at ~1e-14). Throws Error(unsupported) for a dense llama file or
// another architecture, Error(bad_input) for inconsistent hyperparameters.
ModelConfig model_config_from_gguf(const GgufFile& file, const std::string& path);

}  // namespace kvasir
