// Captures (protocols/CAPTURE.md): what ONE node computed for a protocol,
// written on the machine the node lives on, and compared later with captures
// from other machines and other runtimes (numpy, PyTorch, ...).
//
// capture_node() runs exactly the computations run_audit() runs for a
// candidate — same inputs, same options, discrete decisions pinned to the
// same authority (the f64 oracle cpu-ref, which runs anywhere and is run
// beside the node) — and keeps the raw outputs. compare_captures() (audit.hpp)
// turns them into the same measurements, verdicts and report as run_audit().
//
// Files are safetensors with a __metadata__ block and a content hash over
// metadata and tensors; read_capture() refuses a file whose hash does not
// match (tampered), a truncated file (the safetensors reader), or one of
// another format. Tensors are memory-mapped, not loaded: compare touches only
// the tensors it compares, one step at a time.
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/core/tensor.hpp"
#include "kvasir/model/safetensors.hpp"
#include "kvasir/audit/audit_config.hpp"
#include "kvasir/audit/step.hpp"
#include "kvasir/steps/node_clock.hpp"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvasir {

inline constexpr const char* kCaptureFormat = "kvasir-equiv/capture/1";

// A capture being written (owns its tensors).
struct CaptureData {
    std::map<std::string, std::string> metadata;  // every key of CAPTURE.md but content_hash
    std::map<std::string, Tensor> tensors;
};

// A capture read back (tensors stay in the mapped file): one node's outputs
// as compare() reads them.
class Capture final : public NodeOutputs {
public:
    static Capture open(const std::string& path);  // read_capture

    const std::string& path() const { return path_; }
    const std::string& node() const override { return node_; }
    const std::string& origin() const override { return path_; }
    const nlohmann::ordered_json& capabilities() const { return capabilities_; }
    const std::string& protocol_hash() const;
    const std::string& model_fingerprint() const;
    std::uint64_t seed() const { return seed_; }
    const std::vector<std::string>& steps() const { return steps_; }
    const std::map<std::string, std::string>& errors() const { return errors_; }
    // Steps the writer says this node cannot provide → why (metadata
    // "not_captured", optional): their criteria are not judged for it.
    const std::map<std::string, std::string>& not_captured() const { return not_captured_; }
    // capabilities.authority == "none": the node ran its own router and its
    // own decoding (no decisions pinned by the authority).
    bool free_running() const { return free_running_; }
    // A fault-injecting node (metadata "faults_injected", optional): step →
    // op outputs its fault corrupted there (NodeInput::faults_fired).
    const std::optional<std::map<std::string, std::int64_t>>& faults_injected() const { return faults_; }
    const std::map<std::string, std::string>& metadata() const { return file_->metadata(); }
    // Did this capture run `step` (listed in steps, not failed)?
    bool has_step(const std::string& step) const;
    bool has(const std::string& tensor) const override { return file_->contains(tensor); }
    const std::vector<std::string>& tensor_names() const { return file_->names(); }
    // Error(bad_input) "<path>: capture has no tensor '<name>'" when absent.
    TensorView view(const std::string& tensor) const override;
    // A metadata entry (ops_inputs, ops_errors, ...).
    std::optional<std::string> note(const std::string& key) const override;

private:
    std::string path_, node_;
    nlohmann::ordered_json capabilities_;
    std::uint64_t seed_ = 0;
    std::vector<std::string> steps_;
    std::optional<std::map<std::string, std::int64_t>> faults_;
    std::map<std::string, std::string> errors_, not_captured_;
    bool free_running_ = false;
    std::shared_ptr<SafetensorsFile> file_;
};

// SHA-256 content hash (CAPTURE.md) of metadata (content_hash itself
// skipped) and tensors, "sha256:<hex>".
std::string capture_content_hash(const std::map<std::string, std::string>& metadata,
                                 const std::map<std::string, TensorView>& tensors);

// Runs `steps` (a subset of the protocol's, in protocol order; empty = all)
// on `node`, with `authority` (cpu-ref; may be the node itself) deciding
// routing, anchors and teacher-forced tokens: each step object's decide on
// the authority, then its collect on the node (step.hpp). Per-step failures
// of the node are recorded in metadata "errors" and the capture goes on; a
// failure of the authority, or bad input, throws; a node capturing itself
// (the reference) that computes NaN/Inf is Error(bad_input) as in the audit.
// Metadata "step_seconds" records each step's wall seconds and, for a node
// with a weight cache, "weight_cache" its counters at the end (the isolated
// audit's timings; not compared). `config.failed_nodes` is ignored.
//
// `shared` (the isolated audit's node processes; capture --decisions-out /
// --decisions-in): the reference's capture decides every step first and
// writes each sharing step's decisions (Step::shares_decisions) into
// `shared.dir` as "<step>.decisions" before it collects anything; another
// node's capture reads them from there — waiting for each, up to
// `shared.wait_s` — instead of running the authority's passes again. Each
// file names the protocol, seed, model and authority it was decided for, and
// a file that does not match this capture is Error(bad_input); a writer that
// fails leaves "failed" in the folder, which ends a waiting reader
// (Error(backend_failure)).
struct SharedDecisions {
    enum class Mode : std::uint8_t { none, write, read };
    Mode mode = Mode::none;
    std::string dir;
    double wait_s = 3600;
};
CaptureData capture_node(const AuditConfig& config, Backend& node, Backend& authority,
                         const std::vector<std::string>& steps = {}, const SharedDecisions& shared = {});
// One step's decisions file (untrusted: a folder named on the command line),
// as the NodeOutputs Step::load_decisions reads; its metadata as notes.
std::unique_ptr<NodeOutputs> open_decisions_file(const std::string& path);

// The timings recorded in captures (their "step_seconds" and "weight_cache"
// metadata), one node per capture, for the steps `steps`: what the isolated
// audit's, capture's and compare's --timings show; `steps` empty: every
// step a capture timed. No load phase (each node's process read its own
// weights inside its steps).
RunTimings timings_of_captures(const std::vector<const Capture*>& captures, std::vector<std::string> steps);
// The same from nodes' capture metadata held in memory (a capture just
// made, whose file may have been discarded: -o /dev/null).
struct NodeMetadata {
    std::string node;
    const std::map<std::string, std::string>* metadata = nullptr;
};
RunTimings timings_of_metadata(const std::vector<NodeMetadata>& nodes, std::vector<std::string> steps);

// Adds content_hash and writes atomically (write_safetensors).
void write_capture(const std::string& path, const CaptureData& capture);

}  // namespace kvasir
