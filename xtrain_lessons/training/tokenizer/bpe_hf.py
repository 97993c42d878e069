"""Our byte-level BPE as a Hugging Face `tokenizer.json`, and back.

    text = to_hf_json(tok)                      # tokenizers.Tokenizer.from_str(text): same ids
    tok = from_hf_json(Path("tokenizer.json").read_text())   # a GPT-2-style byte-level BPE
    save_pretrained(tok, "runs/tok")            # tokenizer.json + tokenizer_config.json (AutoTokenizer)
    eng = train_tokenizer_impl("course", ["data/stories.txt"], 2048)  # xtrain train --tokenizer-impl

The file is the one `tokenizer.py` writes with the `tokenizers` trainer: a BPE model whose
vocab keys are the tokens' bytes in GPT-2's printable form ("Ġthe"), merges as "a b" strings,
the special tokens as added tokens, and the ByteLevel pre-tokenizer (GPT-2's regex, no prefix
space) and decoder. Only that configuration reads back: a tokenizer.json with a normalizer,
another split pattern or a prefix space would give other ids, and is refused by name.

`EngineTokenizer` wraps our `Tokenizer` in the methods the engine calls on a
`tokenizers.Tokenizer` (encode(...).ids, encode_batch, decode, get_vocab_size, token_to_id,
to_str), so `xtrain train --tokenizer-impl course` runs on our encoder end to end.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from xtrain_lessons.training.tokenizer.bpe_tokenizer import Tokenizer, _atomic_write, str_to_token, token_to_str
from xtrain_lessons.training.tokenizer.bpe_train import train_bpe
from xtrain_lessons.training.tokenizer import load_tokenizer, train_tokenizer

EOT = "<|endoftext|>"
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def to_hf_dict(tok: Tokenizer) -> dict:
    """The tokenizer.json content (a dict) of `tok`."""
    specials = {s.encode("utf-8"): s for s in tok.special_tokens}
    vocab: dict[str, int] = {}
    for i, b in sorted(tok.vocab.items()):
        key = specials.get(b) or token_to_str(b)
        if key in vocab:
            raise ValueError(f"tokens {vocab[key]} and {i} both write as {key!r} in tokenizer.json")
        vocab[key] = i
    added = [{"id": tok.special_ids[s], "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for s in tok.special_tokens]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": vocab,
             # "a b" strings, which every tokenizers release reads (byte-level tokens hold no space)
             "merges": [f"{token_to_str(a)} {token_to_str(b)}" for a, b in tok.merges]}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": sorted(added, key=lambda t: t["id"]), "normalizer": None,
            "pre_tokenizer": dict(BYTE_LEVEL), "post_processor": None,
            "decoder": {**BYTE_LEVEL, "add_prefix_space": True}, "model": model}


def to_hf_json(tok: Tokenizer, pretty: bool = False) -> str:
    return json.dumps(to_hf_dict(tok), ensure_ascii=False, indent=2 if pretty else None)


def from_hf_dict(j: dict, where: str = "tokenizer.json") -> Tokenizer:
    """Our Tokenizer from a byte-level BPE tokenizer.json (as a dict); refuses other kinds."""
    model = j.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"{where}: model type {model.get('type')!r}; only BPE reads into this tokenizer")
    _require_byte_level(j, where)
    for flag in ("continuing_subword_prefix", "end_of_word_suffix", "dropout"):
        if model.get(flag):
            raise ValueError(f"{where}: the BPE model sets {flag}={model[flag]!r}, which this tokenizer lacks")
    if model.get("ignore_merges"):
        raise ValueError(f"{where}: ignore_merges=true changes the ids; this tokenizer always merges")
    added = j.get("added_tokens") or []
    for t in added:
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            raise ValueError(f"{where}: added token {t['content']!r} strips spaces or needs a whole word; unsupported")
    specials = [t["content"] for t in added]
    vocab = {}
    for s, i in model["vocab"].items():
        vocab[int(i)] = s.encode("utf-8") if s in specials else str_to_token(s)
    for t in added:
        vocab[int(t["id"])] = t["content"].encode("utf-8")
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model.get("merges") or []]
    merges = [(str_to_token(a), str_to_token(b)) for a, b in merges]
    return Tokenizer(vocab, merges, specials)


def _require_byte_level(j: dict, where: str) -> None:
    if j.get("normalizer"):
        raise ValueError(f"{where}: has a normalizer ({j['normalizer'].get('type')}); unsupported")
    pre = j.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        raise ValueError(f"{where}: the pre-tokenizer must be ByteLevel with GPT-2's regex and no prefix "
                         f"space, got {json.dumps(pre)[:120]}")


def from_hf_json(text: str, where: str = "tokenizer.json") -> Tokenizer:
    return from_hf_dict(json.loads(text), where)


def load_hf(path: str | os.PathLike) -> Tokenizer:
    """Our Tokenizer from a tokenizer.json file (or a directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        j = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    return from_hf_dict(j, str(path))


def save_pretrained(tok: Tokenizer, out_dir: str | os.PathLike) -> Path:
    """tokenizer.json + tokenizer_config.json in `out_dir`, for `AutoTokenizer.from_pretrained`."""
    out = Path(out_dir)
    _atomic_write(out / "tokenizer.json", to_hf_json(tok, pretty=True))
    eot = EOT if EOT in tok.special_tokens else (tok.special_tokens or [None])[0]
    # PreTrainedTokenizerFast uses tokenizer.json as it is (a GPT-2 class would rebuild it).
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    if eot:
        config.update(bos_token=eot, eos_token=eot, unk_token=eot)
    _atomic_write(out / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    return out


# ----- the engine's view: the methods train.py / data.py call on a tokenizers.Tokenizer ----------

@dataclass
class Encoding:
    ids: list[int]


class EngineTokenizer:
    """Our Tokenizer behind the `tokenizers.Tokenizer` methods the engine uses."""
    def __init__(self, tok: Tokenizer):
        self.tok = tok

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        return Encoding(self.tok.encode(text))

    def encode_batch(self, texts, add_special_tokens: bool = False) -> list[Encoding]:
        return [Encoding(self.tok.encode(t)) for t in texts]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if skip_special_tokens:
            special = set(self.tok.special_ids.values())
            ids = [i for i in ids if int(i) not in special]
        return self.tok.decode(ids)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return max(self.tok.vocab) + 1  # the embedding size: every id must fit

    def token_to_id(self, token: str) -> int | None:
        if token in self.tok.special_ids:
            return self.tok.special_ids[token]
        try:
            return self.tok.ids.get(str_to_token(token))
        except ValueError:
            return None

    def to_str(self, pretty: bool = False) -> str:
        return to_hf_json(self.tok, pretty)

    def save(self, path: str, pretty: bool = True) -> None:

        _atomic_write(path, to_hf_json(self.tok, pretty))


def train_engine_tokenizer(files, vocab_size: int, progress: bool = False) -> EngineTokenizer:
    """Like tokenizer.train_tokenizer, with our trainer: EOT id 0, then 256 bytes, then merges."""
    files = [Path(f) for f in files]
    if len(files) != 1:
        raise ValueError(f"the course trainer reads one text file, got {len(files)}")
    vocab, merges = train_bpe(files[0], vocab_size, [EOT], progress=progress)
    return EngineTokenizer(Tokenizer(vocab, merges, [EOT]))


def load_engine_tokenizer(path: str | os.PathLike) -> EngineTokenizer:
    return EngineTokenizer(load_hf(path))


IMPLS = ("course", "hf")


def train_tokenizer_impl(impl: str, files, vocab_size: int):
    """`xtrain train --tokenizer-impl`: "course" trains with bpe_train, "hf" with `tokenizers`."""
    if impl == "course":
        return train_engine_tokenizer(files, vocab_size)
    if impl == "hf":
        return train_tokenizer(files, vocab_size)
    raise ValueError(f"tokenizer implementation must be one of {IMPLS}, got {impl!r}")


def load_tokenizer_impl(impl: str, path: str | os.PathLike):
    """A tokenizer.json (or a folder holding one) read by our Tokenizer or by `tokenizers`."""
    if impl == "course":
        return load_engine_tokenizer(path)
    if impl == "hf":
        return load_tokenizer(path)
    raise ValueError(f"tokenizer implementation must be one of {IMPLS}, got {impl!r}")
