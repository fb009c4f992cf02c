"""Incremental detokenization that never emits broken UTF-8, and stop strings.

Byte-level BPE tokenizers (GPT-2 style: SmolLM2, Llama-3, Qwen2) map every token to raw bytes; a
multi-byte character may span tokens. The bytes go through an incremental UTF-8 decoder, which holds an
incomplete trailing sequence back until the next token completes it. Other tokenizers (SentencePiece)
fall back to decoding the whole output and emitting the new suffix, holding back a trailing U+FFFD.
Special tokens (EOS, chat markers) produce no text.

Stop strings: text that could still grow into a stop string is held back; when one appears, the text
is cut before it and the request finishes with reason "stop".
"""

from __future__ import annotations

import codecs
from functools import lru_cache


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable character each byte is stored as -> the byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"


class TokenBytes:
    """Token id -> its bytes (byte-level tokenizers), cached per tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.byte_level = _is_byte_level(tokenizer)
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        b = self._cache.get(token_id)
        if b is None:
            b = self._cache[token_id] = self._bytes(token_id)
        return b

    def _bytes(self, token_id: int) -> bytes:
        if token_id in self.special:
            return b""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        table = _byte_decoder()
        if piece is not None and all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece)
        return self.tokenizer.decode([token_id], skip_special_tokens=True).encode()  # an added token


class Detokenizer:
    """push(token id) -> text that is safe to show now; flush() -> the rest at the end."""

    def __init__(self, token_bytes: TokenBytes, stop: list[str] | tuple = ()):
        self.token_bytes = token_bytes
        self.stop = list(stop)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []
        self._decoded = ""  # text decoded so far (fallback path)
        self.text = ""  # all text, stop string cut
        self._emitted = 0  # characters of self.text already returned
        self.stopped = False

    def _decode(self, token_id: int, final: bool) -> str:
        if self.token_bytes.byte_level:
            return self._utf8.decode(self.token_bytes(token_id) if token_id >= 0 else b"", final=final)
        if token_id >= 0:
            self._ids.append(token_id)
        full = self.token_bytes.tokenizer.decode(self._ids, skip_special_tokens=True)
        if not final and full.endswith("\ufffd"):
            full = full.rstrip("\ufffd")
        if not full.startswith(self._decoded):  # the tokenizer re-merged earlier text: emit nothing new
            return ""
        new, self._decoded = full[len(self._decoded):], full
        return new

    def push(self, token_id: int, final: bool = False) -> str:
        if self.stopped:
            return ""
        before = len(self.text)
        self.text += self._decode(token_id, final)
        for s in self.stop:
            at = self.text.find(s, max(0, before - len(s) + 1))
            if at >= 0:
                self.text = self.text[:at]
                self.stopped = True
        end = len(self.text) if (final or self.stopped) else len(self.text) - self._held_back()
        end = max(end, self._emitted)
        delta, self._emitted = self.text[self._emitted:end], end
        return delta

    def flush(self) -> str:
        return self.push(-1, final=True)

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
