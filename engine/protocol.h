// engine/protocol.h — the text of the engine line protocol (docs/PROTOCOL.md): parsing one command line
// into a `command`, and formatting the numbers and messages the engine writes back.
//
// Contract:
//  - Pure functions (no model, no state), except protocol_write_line: the one writer of stdout (one line,
//    then a flush). The serve loop decides what a parsed command does.
//  - protocol_parse never throws and never reads past the line; on a malformed line it returns false and
//    sets command::error to a one-line reason (the loop answers `ERR <reason>`).
//  - It checks what the line alone decides: the command word, integers, `k=v` values, id lists and ids
//    against n_vocab. Whatever needs engine state (context, slot busy, slot count) is the loop's.
//  - Unknown request keys are skipped, as the contract says.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sampler.h"

enum cmd_kind : int32_t {
    CMD_NONE = 0,    // blank line: nothing to do
    CMD_BGEN,        // BGEN <slot> <max_new>[ k=v ...] <ids>
    CMD_BSTOP,       // BSTOP <slot>
    CMD_VRAM,        // VRAM [reserve_mib]
    CMD_QUIT,        // QUIT
    CMD_BEMB,        // BEMB <slot> <ids>: embedding in an idle slot, read in the slot steps
    CMD_PING,        // PING <n>: answered PONG <n> by the loop when it takes the line (liveness)
    CMD_BSAVE,       // BSAVE <slot> <path>: an idle slot's tokens + KV to a file
    CMD_BRESTORE,    // BRESTORE <slot> <path>: a file into an idle slot
    CMD_BERASE,      // BERASE <slot>: an idle slot forgets its tokens
    CMD_BCLOSE,      // BCLOSE <slot>: a constrained request writes its grammar's shortest completion and ends
};

struct command {
    cmd_kind kind = CMD_NONE;
    int32_t slot = -1;          // BGEN/BEMB/BSTOP/BSAVE/BRESTORE/BERASE/BCLOSE
    int32_t max_new = 0;        // BGEN
    sampler_params sampling;    // BGEN
    bool ckpt = true;           // BGEN: ckpt=0 asks for no conversation checkpoint (a one-shot call)
    bool draft = true;          // BGEN: draft=0 turns drafting off for this request (engine/drafting.h)
    std::string grammar;        // BGEN: grammar=<GBNF, %XX-escaped>, decoded ("" = unconstrained)
    std::vector<int32_t> ids;   // BGEN/BEMB: the prompt
    std::string path;           // BSAVE/BRESTORE
    int64_t vram_mib = -1;      // VRAM argument, -1 when absent
    int64_t ping = 0;           // PING's number, echoed in PONG
    std::string error;          // set when protocol_parse returns false
};

// Longest message text an ERR/SERR line carries, in bytes (the reference engine's limit).
constexpr size_t PROTOCOL_MESSAGE_MAX_BYTES = 512;

// Parses one line (without its '\n'; a trailing '\r' is ignored). n_vocab bounds the ids.
bool protocol_parse(const std::string& line, int32_t n_vocab, command* out);

// A message made safe for one protocol line: control characters become spaces, at most
// PROTOCOL_MESSAGE_MAX_BYTES bytes (cut on a UTF-8 character boundary).
std::string protocol_message(const std::string& text);

// Milliseconds (or any figure) with one decimal: "12.3".
std::string protocol_fixed1(double value);
// " experts_hits=<n> experts_misses=<n>" (the expert tiers' reads so far, engine-wide: engine/expert_tiers.h), or ""
// when no expert was read from either tier; DONE and BDONE end with it.
std::string protocol_expert_words(uint64_t hits, uint64_t misses);
struct strata_model;
// protocol_expert_words of the model's figures (model_expert_figures).
std::string expert_words(const strata_model* model);

// Writes `line` and '\n' to stdout and flushes (with it, any token lines still held). Only the serve loop's
// thread calls it, and the protocol_*_token* functions below.
void protocol_write_line(const std::string& line);

// Token lines (BT after a slot's first token) may be held in stdout's buffer so that the tokens of several
// steps reach the server in one write (docs/PROTOCOL.md "Token flush"): a line written here goes out at the
// next protocol_write_line, at protocol_flush_tokens(), or at protocol_flush_tokens_due() once `ms` have
// passed since the last flush. `ms` 0 (the default) flushes every line at once.
void protocol_set_token_flush_ms(int64_t ms);
void protocol_write_token_line(const std::string& line);
void protocol_flush_tokens();      // held token lines go out now (before a wait, or a long step)
void protocol_flush_tokens_due();  // ... if the last flush is `ms` old (after each slot step)

// Strict decimal parsers used by the command parser and by main()'s flags.
bool protocol_parse_i64(const std::string& text, int64_t* out);
bool protocol_parse_f32(const std::string& text, float* out);
