// JUnit XML of an audit, for CI: <testsuites> with one <testsuite> per node
// (properties: the verdict and the capabilities) and one <testcase> per
// judged criterion per tier (name "<tier>: <criterion>"), plus one per step
// error. What fails is tied to the gate so that the file and the exit code
// never disagree:
//   * a failing criterion of a gated tier → <failure message="...">, an
//     unmeasured one too ("nothing compared is never a pass");
//   * a non-finite value or a step error → <error message="...">;
//   * a failing criterion of a tier the gate does not cover (sensitive
//     criteria under --gate tolerant; everything under --gate none) →
//     <skipped message="not gated: ...">;
//   * zero judged nodes → a testcase "audit: nodes judged" with a failure.
// Invariant (tested): failures + errors > 0  ⇔  exit_code(nodes, gate) == 1.
// The reference node's suite holds one passing testcase "reference" (plus an
// <error> per step error of the reference when gated).
#pragma once

#include "kvasir/audit/results.hpp"

#include <string>

namespace kvasir {

// JUnit XML (see the top of this file), UTF-8, XML-escaped throughout.
std::string junit_xml(const AuditReport& report);

}  // namespace kvasir
