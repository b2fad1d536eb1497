"""Incremental prompt encoder: tokenises a growing chat by re-encoding only what a kept prompt does not share.

Role: the server encodes every chat prompt through one PromptEncoder per tokenizer. A conversation's
next turn repeats the previous prompt as its prefix; the ids up to the last special-token mark inside
that shared prefix are reused and only the text after it is tokenised (see the marks contract in
tokenizer/bpe.py). The result always equals tokenizer.encode(text, True, plain). This module
knows nothing of HTTP, chat templates or the engine, and nothing of BPE: it needs only the tokenizer's
encode_marked(), special_pattern() and max_special_chars.

Public surface:
    PromptEncoder(tok, keep=4).encode(text, plain=None, store=True) -> ids, .forget(ids), .reused_ids
    common_prefix_len(a, b) -> int
(Import it from here: tokenizer.bpe, which this module imports, does not re-export it.)

Thread safety: one lock guards the kept prompts; any number of threads may encode concurrently.
reused_ids is per thread.
"""

import bisect
import threading

from tokenizer.bpe import check_text, normalize_spans

LCP_CHUNK_CHARS = 4096  # common-prefix search compares this many chars per slice before bisecting


def common_prefix_len(a, b):
    """Length of the longest common prefix of two strings, in C-speed slices (no per-char Python loop)."""
    n = min(len(a), len(b))
    pos = 0
    while pos < n:
        end = min(n, pos + LCP_CHUNK_CHARS)
        if a[pos:end] == b[pos:end]:
            pos = end
            continue
        lo, hi = pos, end  # a[:lo] == b[:lo]; the first difference is before hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        return lo
    return n


class _Kept:
    """One kept prompt: its text, normalized plain spans, ids and special-token marks. All fields are
    immutable except `replaced`, which only PromptEncoder reads or writes, under its lock."""

    __slots__ = ("text", "plain", "ids", "marks", "mark_offsets", "replaced")

    def __init__(self, text, plain, ids, marks):
        self.text, self.plain, self.ids, self.marks = text, plain, ids, marks
        self.mark_offsets = [m[0] for m in marks]
        self.replaced = None  # the kept prompt this one replaced, put back by forget()


class PromptEncoder:
    """Encodes chat prompts with parse_special=True, re-encoding only what a kept prompt does not share.

    For each kept prompt, the longest common text prefix (bounded by where the plain spans stop agreeing)
    is mapped back to the last special-token mark at or before it; the ids up to that mark are reused and
    only the text after it is encoded. A mark that a special literal of the new text straddles is
    skipped, so the result always equals tokenizer.encode(text, True, plain). One prompt per
    conversation is kept (the one it extends is replaced), `keep` in all, least recently used dropped
    first; forget(ids) drops a refused prompt and puts back the one it replaced.
    """

    MAX_MARK_TRIES = 8  # marks tried backwards past straddling specials before encoding from scratch

    def __init__(self, tokenizer, keep=4):
        self.tokenizer = tokenizer
        self.keep = max(0, int(keep))
        self._lock = threading.Lock()  # guards _kept and each kept item's `replaced`
        self._kept = []                # most recently used last
        self._local = threading.local()

    @property
    def reused_ids(self):
        """Ids reused by this thread's last encode (for metrics and tests)."""
        return getattr(self._local, "reused_ids", 0)

    def encode(self, text, plain=None, store=True):
        check_text(text)
        spans = normalize_spans(plain, len(text))
        with self._lock:
            kept = list(self._kept)
        base, cut, n_ids, mark_index = None, 0, 0, 0
        for entry in kept:
            found = self._reuse_point(entry, text, spans)
            if found is not None and (base is None or found[0] > cut):
                base, (cut, n_ids, mark_index) = entry, found
        tail = text[cut:]
        tail_spans = [(s - cut, e - cut) for s, e in spans if e > cut]
        tail_ids, tail_marks = self.tokenizer.encode_marked(tail, True, tail_spans)
        if base is None:
            ids, marks = tail_ids, tail_marks
        else:
            ids = base.ids[:n_ids] + tail_ids
            marks = base.marks[:mark_index] + [(o + cut, k + n_ids) for o, k in tail_marks]
        self._local.reused_ids = n_ids
        if store and self.keep:
            self._store(_Kept(text, spans, ids, marks), base)
        return ids

    def _reuse_point(self, entry, text, spans):
        """(char offset, ids before it, marks before it) reusable from `entry`, or None."""
        if not entry.marks:
            return None
        limit = min(common_prefix_len(entry.text, text), _spans_agree_until(entry.plain, spans))
        k = bisect.bisect_right(entry.mark_offsets, limit)
        for idx in range(k - 1, max(-1, k - 1 - self.MAX_MARK_TRIES), -1):
            cut, n_ids = entry.marks[idx]
            if not self._straddled(text, cut):
                return cut, n_ids, idx + 1
        return None

    def _straddled(self, text, cut):
        """Whether a special literal of `text` starts before `cut` and ends after it."""
        match = self.tokenizer.special_pattern(True).match
        for q in range(max(0, cut - self.tokenizer.max_special_chars + 1), cut):
            m = match(text, q)  # the longest literal at q: if it ends by `cut`, every other one does
            if m is not None and m.end() > cut:
                return True
        return False

    def _store(self, new, base):
        with self._lock:
            kept = [e for e in self._kept if e is not base]
            if base is not None and len(kept) < len(self._kept):
                new.replaced = base
                base.replaced = None  # one level of undo only: no chain through the whole history
            kept.append(new)
            self._kept = kept[-self.keep:]

    def forget(self, ids):
        """Drop the kept prompt whose ids are `ids` (a prompt the engine refused), putting back the one
        it had replaced: the engine still holds that conversation."""
        ids = list(ids)
        with self._lock:
            kept = []
            for e in self._kept:
                if e.ids != ids:
                    kept.append(e)
                elif e.replaced is not None and e.replaced not in self._kept:
                    kept.append(e.replaced)
                    e.replaced = None
            self._kept = kept


def _spans_agree_until(a, b):
    """The largest x such that normalized spans `a` and `b` clipped to [0, x) are equal."""
    for (sa, ea), (sb, eb) in zip(a, b):
        if sa != sb:
            return min(sa, sb)
        if ea != eb:
            return min(ea, eb)
    if len(a) > len(b):
        return a[len(b)][0]
    if len(b) > len(a):
        return b[len(a)][0]
    return float("inf")
