"""Incremental detokenization that never emits broken UTF-8, and stop strings.

Byte-level BPE tokenizers (GPT-2 style: SmolLM2, Llama-3, Qwen2) map every token to raw bytes; a
multi-byte character may span tokens. The bytes go through an incremental UTF-8 decoder, which holds an
incomplete trailing sequence back until the next token completes it. Other tokenizers (SentencePiece)
fall back to decoding the output and emitting the new suffix, holding back a trailing U+FFFD; the
decoded window slides (the last _WINDOW tokens) where its text checks out as the end of the text so far.
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
    """Token id -> its bytes (byte-level tokenizers), cached per tokenizer; and its text where those bytes
    are whole UTF-8 characters."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.byte_level = _is_byte_level(tokenizer)
        self._cache: dict[int, bytes] = {}
        self._text: dict[int, str | None] = {}

    def __call__(self, token_id: int) -> bytes:
        b = self._cache.get(token_id)
        if b is None:
            b = self._cache[token_id] = self._bytes(token_id)
        return b

    def text(self, token_id: int) -> str | None:
        """The token's bytes decoded, or None where they are not whole UTF-8 characters."""
        try:
            return self._text[token_id]
        except KeyError:
            pass
        try:
            text = self(token_id).decode("utf-8")
        except UnicodeDecodeError:
            text = None
        self._text[token_id] = text
        return text

    def _bytes(self, token_id: int) -> bytes:
        if token_id in self.special:
            return b""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        table = _byte_decoder()
        if piece is not None and all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece)
        return self.tokenizer.decode([token_id], skip_special_tokens=True).encode()  # an added token


_WINDOW = 8  # tokens the fallback path keeps decoding behind the newest one (a character's bytes fit)


class Detokenizer:
    """push(token id) -> text that is safe to show now; flush() -> the rest at the end."""

    def __init__(self, token_bytes: TokenBytes, stop: list[str] | tuple = ()):
        self.token_bytes = token_bytes
        self.stop = list(stop)
        self._partial = b""  # byte-level path: the start of a character the next token completes
        self._ids: list[int] = []
        self._start = 0  # fallback path: the first token of the window decoded at each push
        self._decoded = ""  # fallback path: text of the window emitted so far
        self.text = ""  # all text, stop string cut
        self._emitted = 0  # characters of self.text already returned
        self.stopped = False

    def _decode(self, token_id: int, final: bool) -> str:
        if self.token_bytes.byte_level:
            if not self._partial and token_id >= 0:
                text = self.token_bytes.text(token_id)
                if text is not None:
                    return text
            # what codecs' incremental UTF-8 decoder does: hold an incomplete character back
            data = self._partial + (self.token_bytes(token_id) if token_id >= 0 else b"")
            text, used = codecs.utf_8_decode(data, "replace", final)
            self._partial = data[used:]
            return text
        if token_id >= 0:
            self._ids.append(token_id)
        decode = self.token_bytes.tokenizer.decode
        full = decode(self._ids[self._start :], skip_special_tokens=True)
        if not final and full.endswith("\ufffd"):
            full = full.rstrip("\ufffd")
        if not full.startswith(self._decoded):  # the tokenizer re-merged earlier text: emit nothing new
            return ""
        new, self._decoded = full[len(self._decoded) :], full
        held = len(self._ids) - self._start
        if held >= 2 * _WINDOW and held % _WINDOW == 0:
            self._slide(decode)
        return new

    def _slide(self, decode) -> None:
        """Decode from _WINDOW tokens back on, not from the first one (each push then costs a window,
        not the whole output), once those tokens decode to exactly the end of the text decoded so far;
        a decoder whose text there depends on earlier tokens keeps the longer window."""
        start = len(self._ids) - _WINDOW
        tail = decode(self._ids[start:], skip_special_tokens=True)
        if tail and not tail.endswith("\ufffd") and self._decoded.endswith(tail):
            self._start, self._decoded = start, tail

    def push(self, token_id: int, final: bool = False) -> str:
        if self.stopped:
            return ""
        piece = self._decode(token_id, final)
        if not self.stop:  # nothing is held back
            self.text += piece
            self._emitted = len(self.text)
            return piece
        before = len(self.text)
        self.text += piece
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
