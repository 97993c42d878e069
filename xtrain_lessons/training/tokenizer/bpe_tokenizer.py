"""Encoding and decoding with a trained byte-level BPE (vocab id -> bytes, ordered merges).

    tok = Tokenizer(vocab, merges, special_tokens=["<|endoftext|>"])
    ids = tok.encode("Once upon a time<|endoftext|>")
    tok.decode(ids) == "Once upon a time<|endoftext|>"
    for i in tok.encode_iterable(open("big.txt", encoding="utf-8")): ...   # constant memory
    tok.save_files("vocab.json", "merges.txt"); Tokenizer.from_files("vocab.json", "merges.txt", [...])

Encoding cuts out special tokens (the longest wins where two overlap), splits the rest with
GPT-2's regex, and turns each pre-token into bytes and then merges pairs in the order they
were learned: at each step the adjacent pair with the lowest merge rank. A pre-token's ids
depend on nothing else, so they are cached. Decoding joins the tokens' bytes; bytes that are
not valid UTF-8 (a sequence cut in the middle of a character) become U+FFFD.

Files use GPT-2's format: vocab.json maps each token, its bytes written one printable character
per byte (`bytes_to_unicode`), to its id; merges.txt holds one merge per line.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path

from xtrain_lessons.training.tokenizer.bpe_pretokenize import GPT2_RE, special_regex, split_special

# A pre-token may still change when more text arrives if the regex looked near the end of
# what has arrived: it looks at most 2 characters past a match's start (from "'" towards
# "'ll") and 1 past its end. 2 is the exact bound (tests fail with 1); 3 keeps a margin.
_LOOKAHEAD = 3


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map byte -> printable character: printable Latin-1 bytes stand for themselves,
    the others (space, control bytes) are shifted to 256+ ("Ġ" is the space)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def token_to_str(b: bytes) -> str:
    """A token's bytes as GPT-2 writes them in vocab.json and merges.txt."""
    m = bytes_to_unicode()
    return "".join(m[x] for x in b)


def str_to_token(s: str) -> bytes:
    m = unicode_to_bytes()
    try:
        return bytes(m[c] for c in s)
    except KeyError as e:
        raise ValueError(f"{s!r} is not a byte-level token (character {e.args[0]!r} stands for no byte)") from None


class Tokenizer:
    """Byte-level BPE encoder/decoder. vocab: id -> bytes; merges: [(bytes, bytes)] in order."""
    def __init__(self, vocab: dict[int, bytes], merges, special_tokens=None, cache_size: int = 1 << 16):
        self.vocab = dict(vocab)
        self.special_tokens = list(dict.fromkeys(special_tokens or ()))
        self.ids = {b: i for i, b in sorted(self.vocab.items(), reverse=True)}  # lowest id wins
        for s in self.special_tokens:  # a special token missing from the vocab gets a new id
            if s.encode("utf-8") not in self.ids:
                i = max(self.vocab, default=-1) + 1
                self.vocab[i], self.ids[s.encode("utf-8")] = s.encode("utf-8"), i
        self.special_ids = {s: self.ids[s.encode("utf-8")] for s in self.special_tokens}
        missing = [b for b in range(256) if bytes([b]) not in self.ids]
        if missing:
            raise ValueError(f"the vocabulary has no token for byte(s) {missing[:8]}: not a byte-level BPE")
        self.byte_ids = [self.ids[bytes([b])] for b in range(256)]
        self.merges = [(bytes(a), bytes(b)) for a, b in merges]
        self.ranks, self.merged = {}, {}
        for r, (a, b) in enumerate(self.merges):
            if a not in self.ids or b not in self.ids or a + b not in self.ids:
                raise ValueError(f"merge #{r} {a!r} + {b!r} uses or makes a token missing from the vocabulary")
            p = (self.ids[a], self.ids[b])
            if p not in self.ranks:  # a repeated merge never fires again (its pair is gone)
                self.ranks[p], self.merged[p] = r, self.ids[a + b]
        self._special_re = special_regex(self.special_tokens)
        self._max_special = max((len(s) for s in self.special_tokens), default=0)
        self._cache: dict[str, list[int]] = {}
        self._cache_size = cache_size

    # ----- encoding -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text become their ids."""
        ids: list[int] = []
        for piece in split_special(text, special_re=self._special_re):
            special = self.special_ids.get(piece)
            if special is not None:
                ids.append(special)
            else:
                for pt in GPT2_RE.findall(piece):
                    ids.extend(self._encode_pretoken(pt))
        return ids

    def _encode_pretoken(self, pt: str) -> list[int]:
        ids = self._cache.get(pt)
        if ids is None:
            try:
                data = pt.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"the text holds a lone surrogate {pt[e.start]!r}, which has no UTF-8 "
                                 f"form; fix the text (e.g. decode its bytes with errors='replace')") from None
            ids = self._bpe([self.byte_ids[b] for b in data])
            if len(self._cache) >= self._cache_size:
                self._cache.clear()  # bounded memory on endless streams
            self._cache[pt] = ids
        return ids

    def _bpe(self, parts: list[int]) -> list[int]:
        """Apply merges by rank: the adjacent pair learned first is merged first, everywhere."""
        ranks, inf = self.ranks, len(self.merges)
        while len(parts) > 1:
            best = min(zip(parts, parts[1:]), key=lambda p: ranks.get(p, inf))
            if best not in ranks:
                break
            new_id, out, i, n = self.merged[best], [], 0, len(parts)
            while i < n:
                if i + 1 < n and parts[i] == best[0] and parts[i + 1] == best[1]:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out
        return parts

    def encode_iterable(self, chunks: Iterable[str]) -> Iterator[int]:
        """Ids of the concatenated chunks (e.g. the lines of an open file), lazily.

        Same ids as `encode("".join(chunks))`: text is held back until no later chunk can
        change how it splits (a special token or a pre-token possibly continuing), so memory
        stays at about one chunk plus one pre-token.
        """
        buf = ""
        for chunk in chunks:
            buf += chunk
            cut = self._safe_cut(buf)
            if cut:
                yield from self.encode(buf[:cut])
                buf = buf[cut:]
        if buf:
            yield from self.encode(buf)

    def _safe_cut(self, buf: str) -> int:
        """A length c such that encode(buf[:c]) + encode(buf[c:] + more) == encode(buf + more)."""
        # A special token starting before `limit` is fully visible, with every longer rival.
        limit = len(buf) - max(self._max_special - 1, 0)
        start = 0  # the text after the last special token that no future text can change
        if self._special_re is not None:
            for m in self._special_re.finditer(buf, 0, len(buf)):
                if m.start() >= limit:
                    break
                start = m.end()
        # In the text from `start` up to `limit` (no special can begin there), a pre-token is
        # final when the regex looked at nothing past `limit` to find it.
        cut = start
        end_ok = limit - _LOOKAHEAD
        for m in GPT2_RE.finditer(buf, start, max(limit, start)):
            if m.end() > end_ok:
                break
            cut = m.end()
        return cut

    # ----- decoding -------------------------------------------------------------------------

    def decode(self, ids) -> str:
        """Text of `ids`; byte sequences that are not valid UTF-8 become U+FFFD."""
        try:
            data = b"".join(self.vocab[int(i)] for i in ids)
        except KeyError as e:
            raise ValueError(f"token id {e.args[0]} is not in the vocabulary (0..{len(self.vocab) - 1})") from None
        return data.decode("utf-8", errors="replace")

    # ----- files ----------------------------------------------------------------------------

    @classmethod
    def from_files(cls, vocab_filepath, merges_filepath, special_tokens=None) -> Tokenizer:
        """Read GPT-2-format vocab.json and merges.txt (special tokens stored as themselves)."""
        specials = set(special_tokens or ())
        raw = json.loads(Path(vocab_filepath).read_text(encoding="utf-8"))
        vocab = {int(i): (s.encode("utf-8") if s in specials else str_to_token(s)) for s, i in raw.items()}
        merges = []
        for n, line in enumerate(Path(merges_filepath).read_text(encoding="utf-8").split("\n"), start=1):
            if not line.strip() or line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ValueError(f"{merges_filepath}, line {n}: expected two tokens separated by one space")
            merges.append((str_to_token(parts[0]), str_to_token(parts[1])))
        return cls(vocab, merges, special_tokens)

    def save_files(self, vocab_filepath, merges_filepath) -> None:
        """Write vocab.json and merges.txt (GPT-2's format), each atomically."""
        specials = {s.encode("utf-8") for s in self.special_tokens}
        vocab = {(b.decode("utf-8") if b in specials else token_to_str(b)): i
                 for i, b in sorted(self.vocab.items())}
        _atomic_write(vocab_filepath, json.dumps(vocab, ensure_ascii=False, indent=0) + "\n")
        lines = ["#version: 0.2"] + [f"{token_to_str(a)} {token_to_str(b)}" for a, b in self.merges]
        _atomic_write(merges_filepath, "\n".join(lines) + "\n")


def _atomic_write(path, text: str) -> None:

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
