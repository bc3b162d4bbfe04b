// Where the time of a run goes, node by node: NodeClock wraps each node in a
// forwarding decorator that measures the wall time of every call into the
// node (its whole op: upload, kernels, read-back for a device node). What a
// step spends outside those calls is the step's own work — comparing
// results, statistics, bookkeeping. The decorator changes no result: every
// call goes to the node unchanged (ForwardingBackend).
//
// It also knows which node is computing: `on_switch` is called when a call
// goes to a different node than the previous call (a progress line's
// "backend"). Single-threaded use: steps call nodes one at a time.
#pragma once

#include "kvasir/backend/backend.hpp"
#include "kvasir/model/model.hpp"

#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvasir {

class NodeClock {
public:
    using OnSwitch = std::function<void(std::size_t node)>;

    // `nodes` must outlive the clock; timed()[i] forwards to *nodes[i].
    explicit NodeClock(const std::vector<std::unique_ptr<Backend>>& nodes, OnSwitch on_switch = {});
    ~NodeClock();
    NodeClock(const NodeClock&) = delete;
    NodeClock& operator=(const NodeClock&) = delete;

    // The decorators, in the order of the nodes (hand these to the steps).
    std::vector<std::unique_ptr<Backend>>& timed() { return timed_; }
    // A new phase (step) begins: the next call reports its node through
    // on_switch even if it is the node that computed last.
    void new_phase();
    // Seconds spent inside calls to node i since construction.
    double seconds(std::size_t i) const;
    std::size_t size() const { return timed_.size(); }

    struct Shared;  // implementation detail (node_clock.cpp)

private:
    std::shared_ptr<Shared> shared_;
    std::vector<std::unique_ptr<Backend>> timed_;
};

// Where a run's time went: an optional load phase, then per step its wall
// time and the seconds spent inside each node (NodeClock); the rest of a
// step's wall time is its own work (comparing, statistics, bookkeeping).
struct StepTiming {
    std::string step;
    double wall = 0;
    std::vector<double> node_seconds;  // in node order
};

struct NodeTransfers {
    std::string node;
    TransferStats total;
    std::vector<std::pair<std::string, TransferStats>> steps;  // in step order; empty when not recorded
};

struct RunTimings {
    bool loaded = false;           // false: no load phase, weights read lazily during the steps
    std::string load_note;         // why there was none (empty when loaded)
    double load_seconds = 0;       // the load phase (Model::load_layer / load_globals)
    std::uint64_t load_bytes = 0;
    std::vector<std::string> nodes;  // node names, the order of node_seconds
    std::vector<StepTiming> steps;
    // The weight caches of the nodes that have one (device nodes), at the end
    // of the run: node name and counters (backend/weight_cache.hpp).
    std::vector<std::pair<std::string, WeightCacheStats>> weight_caches;
    // The host↔device traffic of the device nodes (TransferStats): the whole
    // run, and per step where the run recorded it (captures do).
    std::vector<NodeTransfers> transfers;
    // An isolated audit's children run `nodes_at_once` at a time (after the
    // reference, alone): above 1 a step's wall is the sum of its nodes'
    // seconds, which include the contention, and `elapsed` is the audit's
    // own wall time (0: not measured).
    int nodes_at_once = 1;
    double elapsed = 0;
    // Each node process's peak memory, from its capture (an isolated audit,
    // compare): bytes of its own (process_memory.hpp; 0 when the capture does
    // not say) and resident, the mapped weights' page cache included.
    struct NodeMemory {
        std::string node;
        std::uint64_t own = 0, resident = 0;
    };
    std::vector<NodeMemory> peak_memory;
};

// Appends the counters of every node that has them (its weight cache, its
// transfers) to `t`.
void record_node_counters(const std::vector<std::unique_ptr<Backend>>& nodes, RunTimings& t);

// The load phase: reads `layers` (and the embedding, final norm and lm_head
// when `globals`) with Model::load_layer / load_globals; records bytes and
// seconds in `t` and marks it loaded.
void load_phase(const Model& model, std::span<const std::int64_t> layers, bool globals, RunTimings& t);

}  // namespace kvasir
