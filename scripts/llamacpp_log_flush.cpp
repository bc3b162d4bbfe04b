// Preloaded into llama.cpp's tools (LD_PRELOAD) by scripts/setup_llamacpp.sh's users: flushes
// llama.cpp's log at exit.
//
// llama.cpp's common logger prints through a worker thread and is intentionally never destroyed
// (common/log.cpp, common_log_main(): "this design may cause logs to be lost if not flushed before
// the program exits"); llama-perplexity returns from main() without flushing it, so on a loaded
// machine the process exits 0 with the tail of its stdout — the whole "KL divergence statistics"
// block — never written (reproduced: 22 of 24 concurrent runs on 2 cores). This library's
// destructor runs before libllama-common's own (it depends on it) and pauses the logger, which
// makes the worker print every queued line and join; the C runtime then flushes stdout.
struct common_log;
common_log* common_log_main();
void common_log_pause(common_log* log);

namespace {
__attribute__((destructor)) void kvasir_flush_llamacpp_log() { common_log_pause(common_log_main()); }
}  // namespace
