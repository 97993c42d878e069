"""Export to the Hugging Face layout and back (phase T09): the closed loop with `transformers`.

    export_hf(model, tokenizer, "runs/hf", dtype="float32")   # or "bfloat16"
    model, tokenizer = import_hf("runs/hf")                   # any Qwen3-layout folder we support
    report = closed_loop_check(model, tokenizer, "runs/hf", ["Once upon a time", "One day"])
    print(report["summary"])
    # transformers (float32): greedy 40 tokens identical on 2/2 prompts; max |Δlogit| 1.1e-06;
    # top-1 agreement 100.0%

An exported folder holds what `AutoModelForCausalLM.from_pretrained(folder)` and
`AutoTokenizer.from_pretrained(folder)` read, offline:

    config.json             Qwen3Config fields (architectures Qwen3ForCausalLM, model_type qwen3)
    model.safetensors       the parameters under their HF names, (out, in) layout, fp32 or bf16
    generation_config.json  bos/eos ids
    tokenizer.json          our byte-level BPE, unchanged
    tokenizer_config.json   tokenizer_class PreTrainedTokenizerFast: transformers uses
                            tokenizer.json as it is (a Qwen tokenizer class would rebuild the
                            pre-tokenizer and change the ids)

Our parameters already carry the HF Qwen3 names and layout, so the mapping is the identity;
the work is the config, the dtype and checking that shapes and names are what Qwen3 expects.

QK-norm. transformers' Qwen3 always applies per-head RMSNorm to q and k. With weight 1 that
is NOT the identity (it rescales every head vector to unit RMS), so a model trained with
`qk_norm=False` has no faithful Qwen3 form: `export_hf` refuses it with a clear error.

bfloat16. Weights are rounded to nearest-even (ml_dtypes); bf16 keeps 8 bits of mantissa
(eps = 2**-7 ~ 7.8e-3), so logits drift by ~1e-2 relative to their scale and greedy
decoding may part ways where two tokens nearly tie. Measured, not hidden: see
`closed_loop_check`.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from xtrain_lessons.autograd.tensor import no_grad
from xtrain_lessons.model.generate import generate
from xtrain_lessons.model.qwen3 import Config, Model
from xtrain_lessons.training.tokenizer import EOT

__all__ = [
    "ExportError",
    "hf_config",
    "config_from_hf",
    "hf_tensor_names",
    "export_hf",
    "import_hf",
    "closed_loop_check",
]

ARCH = "Qwen3ForCausalLM"
MODEL_TYPE = "qwen3"
WEIGHTS = "model.safetensors"
DTYPES = ("float32", "bfloat16")


class ExportError(ValueError):
    """A model or folder that cannot be exported / imported, with the reason."""


# ----- names and config ------------------------------------------------------------------

def hf_tensor_names(config) -> list[str]:
    """The tensor names of a Qwen3ForCausalLM with this config (11 per layer + 3)."""
    names = ["model.embed_tokens.weight"]
    for i in range(config.n_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight"]
        names += [p + f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "q_norm",
                                                          "k_norm", "o_proj")]
        names += [p + "post_attention_layernorm.weight"]
        names += [p + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    return names + ["model.norm.weight", "lm_head.weight"]


def hf_config(config, dtype: str = "float32", bos_id: int | None = None,
              eos_id: int | None = None) -> dict:
    """The config.json dict of a Qwen3ForCausalLM equal to our `Config`."""
    if not config.qk_norm:
        raise ExportError(
            "this model has qk_norm=False, but Qwen3 in transformers always applies per-head "
            "RMSNorm to q and k (with weight 1 it still rescales each head to unit RMS, so it "
            "is not the identity): the exported model would compute different logits. "
            "Train with qk_norm=True to export.")
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return {
        "architectures": [ARCH],
        "model_type": MODEL_TYPE,
        "vocab_size": int(config.vocab_size),
        "hidden_size": int(config.dim),
        "intermediate_size": int(config.ffn_dim),
        "num_hidden_layers": int(config.n_layers),
        "num_attention_heads": int(config.n_heads),
        "num_key_value_heads": int(config.n_kv_heads),
        "head_dim": int(config.head_dim),
        "hidden_act": "silu",
        "max_position_embeddings": int(config.max_seq_len),
        "rms_norm_eps": float(config.norm_eps),
        # transformers >= 5 reads rope_parameters; 4.x reads rope_theta
        "rope_parameters": {"rope_type": "default", "rope_theta": float(config.rope_theta)},
        "rope_theta": float(config.rope_theta),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "use_cache": True,
        "initializer_range": 0.02,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "dtype": dtype,
        "torch_dtype": dtype,
    }


def _rope_theta(hf: dict) -> float:
    """RoPE base of a config.json: `rope_parameters` (transformers 5, maybe one dict per layer
    type), else `rope_theta` (4.x); any rope type but "default" (yarn, llama3, ...) is an error."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ExportError(f"cannot read rope_parameters={rope!r}")
    params = list(rope.values()) if rope and all(isinstance(v, dict) for v in rope.values()) else [rope]
    thetas = set()
    for p in params:
        kind = p.get("rope_type", p.get("type", "default"))
        if kind != "default":
            raise ExportError(f"RoPE scaling ({kind}: {p}) is not supported: only default RoPE")
        thetas.add(float(p.get("rope_theta", hf.get("rope_theta", 10000.0))))
    if len(thetas) > 1:
        raise ExportError(f"different RoPE bases per layer type {sorted(thetas)}: not supported")
    return thetas.pop()


def config_from_hf(hf: dict):
    """Our `Config` from a config.json dict; ExportError for what the engine does not support."""
    archs = hf.get("architectures") or [ARCH]
    if hf.get("model_type") != MODEL_TYPE or ARCH not in archs:
        raise ExportError(f"unsupported architecture: model_type={hf.get('model_type')!r}, "
                          f"architectures={archs}; only {MODEL_TYPE} / {ARCH} can be imported")
    if hf.get("attention_bias"):
        raise ExportError("attention_bias=true: this engine's attention has no biases")
    if hf.get("hidden_act", "silu") != "silu":
        raise ExportError(f"hidden_act={hf['hidden_act']!r}: only silu (SwiGLU) is supported")
    if hf.get("use_sliding_window"):
        raise ExportError("use_sliding_window=true: sliding-window attention is not supported")
    if any(t != "full_attention" for t in hf.get("layer_types") or []):
        raise ExportError(f"layer_types={hf['layer_types']}: only full attention is supported")
    theta = _rope_theta(hf)
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in hf]
    if missing:
        raise ExportError(f"config.json lacks {missing}")
    n_heads = int(hf["num_attention_heads"])
    try:
        return Config(
            vocab_size=int(hf["vocab_size"]),
            dim=int(hf["hidden_size"]),
            n_layers=int(hf["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // n_heads),
            ffn_dim=int(hf["intermediate_size"]),
            rope_theta=float(theta),
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_seq_len=int(hf.get("max_position_embeddings", 2048)),
            qk_norm=True,
        )
    except ValueError as e:
        raise ExportError(f"config.json does not describe a model this engine supports: {e}") from e


# ----- tokenizer -------------------------------------------------------------------------

def _tokenizer_json(tokenizer) -> str:
    """The tokenizer.json text of a `tokenizers.Tokenizer`, or of a path to one."""
    if isinstance(tokenizer, (str, os.PathLike)):
        p = Path(tokenizer)
        return (p / "tokenizer.json" if p.is_dir() else p).read_text(encoding="utf-8")
    if hasattr(tokenizer, "to_str"):
        return tokenizer.to_str(pretty=True)
    if hasattr(tokenizer, "backend_tokenizer"):  # a transformers fast tokenizer
        return tokenizer.backend_tokenizer.to_str(pretty=True)
    raise ExportError(f"cannot export a tokenizer of type {type(tokenizer).__name__}: give a "
                      f"tokenizers.Tokenizer or the path of a tokenizer.json")


def _eot(tok_json: str) -> tuple[str | None, int | None]:
    """The end-of-text token and id of a tokenizer.json (<|endoftext|>, else the first special)."""
    added = [t for t in json.loads(tok_json).get("added_tokens", []) if t.get("special")]
    for t in added:
        if t["content"] == EOT:
            return t["content"], int(t["id"])
    return (added[0]["content"], int(added[0]["id"])) if added else (None, None)


def _tokenizer_config(eot: str | None, max_len: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eot,
        "eos_token": eot,
        "pad_token": eot,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(max_len),
    }


# ----- export ----------------------------------------------------------------------------

def _to_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "bfloat16":
        return a.astype(ml_dtypes.bfloat16)  # round to nearest even
    return a


def _write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _is_hf_folder(d: Path) -> bool:
    try:
        return "model_type" in json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def export_hf(model, tokenizer, out_dir, dtype: str = "float32") -> Path:
    """Write `model` + `tokenizer` as a Hugging Face Qwen3 folder at `out_dir`, atomically.

    The folder is written beside `out_dir` under a temporary name and renamed into place, so
    a reader never sees half an export. An existing `out_dir` is replaced only if it is an
    earlier export (its config.json has a model_type) or empty: never a run directory or
    anything else. Returns `out_dir`.
    """

    config = model.config
    tok_json = _tokenizer_json(tokenizer)
    eot, eot_id = _eot(tok_json)
    cfg = hf_config(config, dtype, bos_id=eot_id, eos_id=eot_id)
    n_tok = len(json.loads(tok_json)["model"].get("vocab", {})) if tok_json else 0
    if n_tok > config.vocab_size:
        raise ExportError(f"the tokenizer has {n_tok} tokens but the model only {config.vocab_size}")

    state = model.state_dict()
    names = hf_tensor_names(config)
    missing = [n for n in names if n not in state]
    extra = [n for n in state if n not in set(names)]
    if missing or extra:
        raise ExportError(f"the model's parameters are not Qwen3's: missing {missing}, unexpected {extra}")
    tensors = {n: _to_dtype(state[n], dtype) for n in names}

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: give a folder to write the Hugging Face model to")
    if out.exists() and any(out.iterdir()) and not _is_hf_folder(out):
        raise ExportError(f"{out} exists and is not an earlier export (no Hugging Face "
                          f"config.json): refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        _write_json(tmp / "config.json", cfg)
        _write_json(tmp / "generation_config.json",
                    {"bos_token_id": eot_id, "eos_token_id": eot_id, "pad_token_id": eot_id,
                     "do_sample": False})
        (tmp / "tokenizer.json").write_text(tok_json, encoding="utf-8")
        _write_json(tmp / "tokenizer_config.json", _tokenizer_config(eot, config.max_seq_len))
        _write_json(tmp / "special_tokens_map.json",
                    {"bos_token": eot, "eos_token": eot, "pad_token": eot} if eot else {})
        old = None
        if out.exists():  # move the earlier export aside, then the new one into place
            old = out.parent / f".tmp-old-{out.name}-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            if old is not None:
                os.rename(old, out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ----- import ----------------------------------------------------------------------------

def _read_weights(d: Path) -> dict[str, np.ndarray]:
    """All tensors of a folder (model.safetensors, or shards listed in its index), as float32."""
    index = d / "model.safetensors.index.json"
    if (d / WEIGHTS).exists():
        files = [d / WEIGHTS]
    elif index.exists():
        files = [d / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        raise ExportError(f"{d} holds no {WEIGHTS} (nor a sharded index); pytorch_model.bin "
                          f"(pickle) is not read")
    out = {}
    for f in files:
        try:
            tensors = load_file(str(f))
        except Exception as e:  # noqa: BLE001 - safetensors raises several kinds
            raise ExportError(f"{f} is not a readable safetensors file ({e})") from e
        for k, v in tensors.items():
            out[k] = np.asarray(v, dtype=np.float32) if v.dtype != np.float32 else v
    return out


def import_hf(hf_dir) -> tuple:
    """(Model, tokenizers.Tokenizer) from a Hugging Face Qwen3 folder.

    Tied embeddings are untied (lm_head = a copy of embed_tokens); bf16/fp16 weights become
    float32. Anything the engine does not compute (biases, RoPE scaling, sliding window, other
    architectures) is an ExportError naming it.
    """


    d = Path(hf_dir)
    if not (d / "config.json").is_file():
        raise ExportError(f"{d} is not a Hugging Face model folder: config.json is missing")
    try:
        hf = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ExportError(f"{d / 'config.json'} is not valid JSON: {e}") from e
    config = config_from_hf(hf)
    weights = _read_weights(d)
    names = hf_tensor_names(config)
    if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights \
            and hf.get("tie_word_embeddings", False):
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].copy()
    missing = [n for n in names if n not in weights]
    extra = sorted(set(weights) - set(names))
    if missing or extra:
        hint = " (biases are not supported)" if any(n.endswith(".bias") for n in extra) else ""
        raise ExportError(f"{d}: tensors do not match a Qwen3 with this config{hint}: "
                          f"missing {missing[:6]}, unexpected {extra[:6]}")
    model = Model(config, seed=0)
    try:
        model.load_state_dict(weights)
    except ValueError as e:
        raise ExportError(f"{d}: {e}") from e
    tok_path = d / "tokenizer.json"
    if not tok_path.is_file():
        raise ExportError(f"{d} has no tokenizer.json (only fast tokenizers can be imported)")
    try:
        return model, Tokenizer.from_file(str(tok_path))
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise ExportError(f"{tok_path} is not a readable tokenizer.json ({e})") from None


# ----- the closed loop with transformers -------------------------------------------------

def closed_loop_check(model, tokenizer, hf_dir, prompts, n_tokens: int = 40,
                      hf_dtype: str | None = None) -> dict:
    """Load `hf_dir` with transformers and compare it with `model` on `prompts`.

    prompts: strings (encoded with `tokenizer`) or lists of token ids.
    hf_dtype: "float32" or "bfloat16" for transformers' weights and compute; default: the
    dtype recorded in config.json (an fp32 export runs in fp32, a bf16 export in bf16).

    Returns a dict: max_abs_dlogit, rel_dlogit (max |Δ| / max |logit|), top1_agreement (over
    every position of every prompt), min_greedy_margin (smallest top-1 minus top-2 logit gap
    along our greedy steps: identical greedy means something when it exceeds max |Δ|),
    tokenizer_ids_equal (string prompts vs AutoTokenizer),
    greedy_identical (per prompt: our `generate(temperature=0)` vs transformers'
    `generate(do_sample=False)`, end-of-text disabled on both sides), first_divergence,
    n_tokens, and `summary`, one line. If torch/transformers are missing: {"available": False,
    "summary": "..."}.
    """
    try:
        import torch  # noqa: PLC0415
        import transformers  # noqa: F401, PLC0415
    except ImportError as e:
        return {"available": False, "summary": f"transformers: not checked ({e.name} is not installed)"}

    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    bar, threads = hf_logging.is_progress_bar_enabled(), torch.get_num_threads()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)  # a tiny model: one thread is several times faster than two
    try:
        return _closed_loop(model, tokenizer, Path(hf_dir), prompts, n_tokens, hf_dtype)
    finally:
        torch.set_num_threads(threads)
        if bar:
            hf_logging.enable_progress_bar()


def _closed_loop(model, tokenizer, hf_dir: Path, prompts, n_tokens: int, hf_dtype) -> dict:
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: PLC0415


    if hf_dtype is None:
        hf_dtype = json.loads((hf_dir / "config.json").read_text()).get("dtype", "float32")
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[hf_dtype]
    hf_model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=tdtype).eval()
    hf_tok = AutoTokenizer.from_pretrained(str(hf_dir))
    # end-of-text must not stop (nor be suppressed in) transformers' greedy run: generate()
    # fills unset fields from the model's own generation config, so clear it there
    hf_model.generation_config.eos_token_id = None

    L = model.config.max_seq_len
    max_d, max_logit, agree, total = 0.0, 0.0, 0, 0
    tok_equal, greedy, divergence, margin = [], [], [], float("inf")
    for prompt in prompts:
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt, add_special_tokens=False).ids
            tok_equal.append(list(hf_tok(prompt, add_special_tokens=False)["input_ids"]) == ids)
        else:
            ids = [int(t) for t in prompt]
        ids = ids[-L:]
        with no_grad():
            ours = np.asarray(model(np.asarray([ids], dtype=np.int64)).numpy()[0], dtype=np.float64)
        with torch.no_grad():
            theirs = hf_model(torch.tensor([ids])).logits[0].float().numpy().astype(np.float64)
        max_d = max(max_d, float(np.abs(ours - theirs).max()))
        max_logit = max(max_logit, float(np.abs(ours).max()))
        agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
        total += len(ids)

        # greedy: prompt + new tokens must fit max_seq_len (our engine slides its window
        # beyond it, transformers would not), so a long prompt keeps only its last tokens
        ids = ids[-max(1, L - n_tokens):]
        n = min(n_tokens, L - len(ids))
        mine = generate(model, ids, n, temperature=0.0, eos_id=None)
        gc = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=None,
                              pad_token_id=0, bos_token_id=None)
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([ids]), generation_config=gc,
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        hf_new = out[0, len(ids):].tolist()
        if mine:  # how far apart top-1 and top-2 were at each of our greedy steps
            with no_grad():
                full = model(np.asarray([ids + mine[:-1]], dtype=np.int64)).numpy()[0, len(ids) - 1:]
            top2 = np.sort(np.asarray(full, dtype=np.float64), axis=-1)[:, -2:]
            margin = min(margin, float((top2[:, 1] - top2[:, 0]).min()))
        greedy.append(mine == hf_new)
        diff = [i for i, (a, b) in enumerate(zip(mine, hf_new)) if a != b]
        divergence.append(diff[0] if diff else (None if len(mine) == len(hf_new) else min(len(mine), len(hf_new))))

    n_same = sum(greedy)
    report = {
        "available": True,
        "hf_dtype": hf_dtype,
        "n_prompts": len(greedy),
        "n_tokens": n_tokens,
        "max_abs_dlogit": max_d,
        "max_abs_logit": max_logit,
        "rel_dlogit": max_d / max_logit if max_logit else float("nan"),
        "top1_agreement": agree / total if total else float("nan"),
        "tokenizer_ids_equal": all(tok_equal) if tok_equal else None,
        "greedy_identical": greedy,
        "first_divergence": divergence,
        "min_greedy_margin": margin,
    }
    tok_note = "" if report["tokenizer_ids_equal"] is not False else "; TOKENIZER IDS DIFFER"
    report["summary"] = (f"transformers ({hf_dtype}): greedy {n_tokens} tokens identical on "
                         f"{n_same}/{len(greedy)} prompts; max |Δlogit| {max_d:.2g}; top-1 "
                         f"agreement {report['top1_agreement']:.1%}{tok_note}")
    return report
