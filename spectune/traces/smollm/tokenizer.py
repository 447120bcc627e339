"""SmolLM2's tokenizer, built from the GGUF metadata: byte-level BPE (GPT-2 style) with
SmolLM's pre-tokenizer, plus the ChatML chat template of the Instruct model.

Why our own: the GGUF carries the vocabulary (`tokenizer.ggml.tokens`), the merge list
(`tokenizer.ggml.merges`, lowest index merges first) and the token types (3 = control); no
tokenizer library is needed, and prompts are encoded exactly as the model was trained.

Encoding: split off control tokens (`<|im_start|>`, ...) when `special=True`; pre-tokenize
(SmolLM: every digit on its own, then the GPT-2 pattern `'s|'t|'re|'ve|'m|'ll|'d| ?L+| ?N+|
?[^\\s L N]+|\\s+(?!\\S)|\\s+`, with L/N the Unicode letter/number classes); map each piece's
UTF-8 bytes to printable characters (the GPT-2 byte map); apply merges by rank.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Any

from spectune.specs.errors import SpecError

TOKEN_TYPE_CONTROL = 3
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_CONTRACTIONS = ("re", "ve", "ll", "s", "t", "m", "d")


def byte_to_unicode() -> dict[int, str]:
    """The GPT-2 byte map: printable Latin-1 bytes stand for themselves, the other bytes take
    the code points 256, 257, ... in byte order (so every byte has a visible character)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _cls(ch: str) -> str:
    """'L' letter, 'N' number, 'S' whitespace, 'P' anything else."""
    if ch.isspace():
        return "S"
    cat = unicodedata.category(ch)
    return cat[0] if cat[0] in "LN" else "P"


def pretokenize(text: str) -> list[str]:
    """Split text into pieces the way SmolLM's pre-tokenizer does (digits isolated, then the
    GPT-2 pattern on each run of non-digits)."""
    out: list[str] = []
    run_start = 0
    for i, ch in enumerate(text):
        if ch.isnumeric():
            out.extend(_gpt2_split(text[run_start:i]))
            out.append(ch)
            run_start = i + 1
    out.extend(_gpt2_split(text[run_start:]))
    return out


def _gpt2_split(s: str) -> list[str]:
    pieces: list[str] = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch == "'":
            hit = next((c for c in _CONTRACTIONS if s.startswith(c, i + 1)), None)
            if hit is not None:
                pieces.append(s[i : i + 1 + len(hit)])
                i += 1 + len(hit)
                continue
        start = i
        if ch == " " and i + 1 < n and _cls(s[i + 1]) != "S":
            i += 1  # ' ?' prefix of a letter/number/other run
        kind = _cls(s[i])
        if kind == "S":
            j = i
            while j < n and s[j].isspace():
                j += 1
            if j < n and j - i > 1:
                j -= 1  # \s+(?!\S): leave the last space to prefix the next piece
            pieces.append(s[i:j])
            i = j
            continue
        j = i + 1
        while j < n and _cls(s[j]) == kind:
            j += 1
        pieces.append(s[start:j])
        i = j
    return pieces


class BPETokenizer:
    """Byte-level BPE over a GGUF vocabulary.

    tokens: list[str] id -> token string (byte-mapped); merges: ["a b", ...] by rank;
    token_types: list[int] (3 = control token, matched verbatim in text when special=True).
    """

    def __init__(
        self,
        tokens: list[str],
        merges: list[str],
        token_types: list[int],
        bos_id: int,
        eos_id: int,
        chat_template: str = "",
    ) -> None:
        self.tokens = list(tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.ranks: dict[tuple[str, str], int] = {}
        for r, m in enumerate(merges):
            a, _, b = m.partition(" ")
            self.ranks[(a, b)] = r
        self.control = {
            self.tokens[i]: i for i, t in enumerate(token_types) if int(t) == TOKEN_TYPE_CONTROL
        }
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.chat_template = chat_template
        self._b2u = byte_to_unicode()
        self._u2b = {u: b for b, u in self._b2u.items()}
        self._bpe = lru_cache(maxsize=65536)(self._bpe_uncached)

    @classmethod
    def from_gguf(cls, reader: Any) -> BPETokenizer:
        f = reader.fields
        model = f["tokenizer.ggml.model"].contents()
        if model != "gpt2":
            raise SpecError(f"expected a gpt2 (byte-level BPE) tokenizer, got {model!r}")
        tmpl = f["tokenizer.chat_template"].contents() if "tokenizer.chat_template" in f else ""
        return cls(
            tokens=list(f["tokenizer.ggml.tokens"].contents()),
            merges=list(f["tokenizer.ggml.merges"].contents()),
            token_types=list(f["tokenizer.ggml.token_type"].contents()),
            bos_id=int(f["tokenizer.ggml.bos_token_id"].contents()),
            eos_id=int(f["tokenizer.ggml.eos_token_id"].contents()),
            chat_template=tmpl,
        )

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    # ---- encoding ---------------------------------------------------------------------------
    def _bpe_uncached(self, word: str) -> tuple[int, ...]:
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = -1, len(self.ranks)
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and r < best_rank:
                    best, best_rank = i, r
            if best < 0:
                break
            merged = parts[best] + parts[best + 1]
            parts[best : best + 2] = [merged]
        ids = []
        for p in parts:
            if p not in self.vocab:
                raise SpecError(f"byte-level piece {p!r} is not in the vocabulary")
            ids.append(self.vocab[p])
        return tuple(ids)

    def _encode_plain(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in pretokenize(text):
            word = "".join(self._b2u[b] for b in piece.encode("utf-8"))
            ids.extend(self._bpe(word))
        return ids

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of `text`; with special=True, control tokens written in the text become
        their single ids (as the chat template needs)."""
        if not special or not self.control:
            return self._encode_plain(text)
        ids: list[int] = []
        i = start = 0
        while i < len(text):
            if text[i] == "<":
                hit = next((t for t in self.control if text.startswith(t, i)), None)
                if hit is not None:
                    ids.extend(self._encode_plain(text[start:i]))
                    ids.append(self.control[hit])
                    i += len(hit)
                    start = i
                    continue
            i += 1
        ids.extend(self._encode_plain(text[start:]))
        return ids

    # ---- decoding ---------------------------------------------------------------------------
    def decode_bytes(self, ids: list[int]) -> bytes:
        out = bytearray()
        for t in ids:
            s = self.tokens[int(t)]
            if s in self.control:
                out += s.encode("utf-8")
            else:
                out += bytes(self._u2b[c] for c in s)
        return bytes(out)

    def decode(self, ids: list[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # ---- chat ---------------------------------------------------------------------------------
    def apply_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The Instruct model's ChatML prompt (what the GGUF's chat_template renders): a default
        system message when the first message is not one, each message as
        `<|im_start|>{role}\\n{content}<|im_end|>\\n`, then `<|im_start|>assistant\\n`."""
        if self.chat_template and "<|im_start|>" not in self.chat_template:
            raise SpecError(
                "the GGUF's chat template is not ChatML; apply_chat only renders ChatML"
            )
        parts = []
        if not messages or messages[0]["role"] != "system":
            parts.append(f"<|im_start|>system\n{self.default_system()}<|im_end|>\n")
        for m in messages:
            parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def default_system(self) -> str:
        """The system message the chat template inserts when none is given."""
        head = "<|im_start|>system\n"
        start = self.chat_template.find(head)
        end = self.chat_template.find("<|im_end|>", start)
        if start < 0 or end < 0:
            return DEFAULT_SYSTEM
        return self.chat_template[start + len(head) : end]

    def encode_chat(self, user: str) -> list[int]:
        """Token ids of a one-turn chat prompt ending where the assistant starts."""
        return self.encode(self.apply_chat([{"role": "user", "content": user}]))
