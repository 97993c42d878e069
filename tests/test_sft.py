"""Supervised fine-tuning and the arithmetic task (T20): the answer parser, the task's splits,
pairs files, held-out accuracy by batched greedy decoding, and `xtrain sft` then
`xtrain grpo --reward arith` end to end on a tiny model."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from xtrain_lessons.cli import grpo, main, sft
from xtrain_lessons.model.generate import generate
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.training.posttrain.accuracy import greedy_completions
from xtrain_lessons.training.posttrain.answers import EOT, follows_format, is_correct, parse_answer, working_holds
from xtrain_lessons.training.posttrain.arith import all_problems, make_task, pretraining_text
from xtrain_lessons.training.posttrain.arith_base import arith_base_run
from xtrain_lessons.training.posttrain.pairs import PairsError, read_pairs, write_pairs
from xtrain_lessons.training.posttrain.rewards import RewardError, load_reward
from xtrain_lessons.training.posttrain.sft import SFTConfig, sft_train


# ----- the answer parser and the format ----------------------------------------------------

@pytest.mark.parametrize("text,answer", [
    ("3 + 4 = 7. <answer>7</answer>", 7.0),
    ("<answer>1</answer> then <answer> -2 </answer>" + EOT, -2.0),   # the last tag
    ("so the answer is \\boxed{12}.", 12.0),
    ("\\boxed{3} and <answer>4</answer>", 4.0),                       # a tag before a box
    ("I think 5, no, 6.5", 6.5),                                      # the last number
    ("no idea" + EOT, None),
    ("<answer>seven</answer>", None),
])
def test_parse_answer(text, answer):
    assert parse_answer(text) == answer


def test_working_holds():
    assert working_holds("3 + 4 = 7. <answer>7</answer>") and working_holds("no working <answer>7</answer>")
    assert working_holds("2 * 3 = 6 and 5 - 7 = -2") and working_holds("1.5 + 1 = 2.5")
    assert not working_holds("3 + 4 = 8. <answer>7</answer>") and not working_holds("1 + 1 = 2, 2 - 1 = 0")


def test_follows_format():
    assert follows_format("3 + 4 = 7. <answer>7</answer>")
    assert follows_format("<answer>7</answer>  " + EOT)
    for bad in ("7", "<answer>7</answer> more", "<answer>7</answer><answer>8</answer>", "<answer></answer>"):
        assert not follows_format(bad), bad
    assert is_correct("x <answer>7</answer>", 7) and not is_correct("x", 7) and is_correct("7.0", 7)


def test_arith_and_format_rewards():
    train, heldout = make_task()
    p = train[0]
    arith = load_reward("arith")
    assert arith(p.prompt, p.response + EOT, 9) == 1.0
    assert arith(p.prompt, f"<answer>{p.answer + 1}</answer>", 3) == 0.0
    false_working = f"{p.a} {p.op} {p.b} = {p.answer + 1}. <answer>{p.answer}</answer>"
    assert arith(p.prompt, false_working, 9) == 0.0 and is_correct(false_working, p.answer)
    assert load_reward("arith+format")(p.prompt, p.response, 9) == 2.0
    assert load_reward("format")(p.prompt, str(p.answer), 1) == 0.0
    assert load_reward("arith", {"q?": 3})("q?", "<answer>3</answer>", 3) == 1.0
    with pytest.raises(RewardError, match="no answer known for the prompt 'unknown'"):
        arith("unknown", "<answer>1</answer>", 3)
    with pytest.raises(RewardError, match="takes no argument"):
        load_reward("arith:5")


# ----- the task -----------------------------------------------------------------------------

def test_arith_task_splits_and_answers():
    problems = all_problems()
    assert len(problems) == 2560 and len({p.prompt for p in problems}) == 2560
    train, heldout = make_task(seed=0, n_heldout=200)
    assert len(heldout) == 200 and len(train) == 2360
    assert not {p.prompt for p in train} & {p.prompt for p in heldout}
    assert make_task(seed=0)[1] == heldout and make_task(seed=1)[1] != heldout
    for p in problems:
        assert p.answer == eval(f"{p.a} {p.op} {p.b}") and p.answer >= 0  # noqa: S307
        assert parse_answer(p.response) == p.answer and follows_format(p.response)
        assert str(p.a) in p.question and str(p.b) in p.question
    text = pretraining_text(train, 50)
    assert text.count("<|endoftext|>") == 49 and "<answer>" not in text
    assert not any(p.question in text for p in heldout)
    with pytest.raises(ValueError, match="n_heldout"):
        make_task(n_heldout=0)


# ----- pairs files --------------------------------------------------------------------------

def test_pairs_round_trip_and_errors(tmp_path):
    rows = [{"prompt": "a?", "response": "b", "answer": 3}, {"prompt": "c?", "response": "d"}]
    write_pairs(tmp_path / "p.jsonl", rows)
    assert read_pairs(tmp_path / "p.jsonl") == rows
    bad = tmp_path / "bad.jsonl"
    for text, msg in [('{"prompt": "a", "response": "b"}\n\n{"prompt": "a", "resp', "line 3: not valid JSON"),
                      ('{"prompt": "a"}\n', "line 1: no \"response\" string"),
                      ('[1, 2]\n', "line 1: expected a JSON object"),
                      ('{"prompt": "a", "response": "b", "answer": "7"}\n', "\"answer\" must be a finite number"),
                      ('\n\n', "holds no pair")]:
        bad.write_text(text)
        with pytest.raises(PairsError, match=msg):
            read_pairs(bad)
    with pytest.raises(PairsError, match="pairs file not found"):
        read_pairs(tmp_path / "none.jsonl")
    assert read_pairs(tmp_path / "p.jsonl", need_response=False)[1] == rows[1]


# ----- held-out accuracy: batched greedy decoding -------------------------------------------

def test_greedy_completions_equal_greedy_generate_per_prompt():
    model = Model(PRESETS["test"], seed=0)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 64, n)) for n in (3, 5, 3, 7, 5, 3)]
    eos = 9
    got = greedy_completions(model, prompts, 8, eos)
    for p, ids in zip(prompts, got):
        expected = generate(model, p, 8, temperature=0.0, eos_id=eos)  # stops before eos
        assert ids[:len(expected)] == expected
        assert ids == expected + [eos] if len(ids) > len(expected) else len(ids) == 8


def test_sft_train_lowers_the_loss_and_stops_when_asked():
    model = Model(PRESETS["test"], seed=0)
    pairs = [([1, 2, 3], [4, 5, 6, 7]), ([8, 9], [10, 11]), ([12], [13, 14, 15])]
    history = sft_train(model, pairs, SFTConfig(steps=30, batch_size=3, lr=1e-2, warmup=2))
    assert history[-1]["loss"] < 0.5 * history[0]["loss"] and len(history) == 30
    stopped = sft_train(model, pairs, SFTConfig(steps=30, batch_size=2), on_step=lambda s, m: s == 3)
    assert len(stopped) == 3
    with pytest.raises(ValueError, match="pair 1 is 70 tokens long"):
        sft_train(model, [([1] * 40, [2] * 30)], SFTConfig(steps=1))
    with pytest.raises(ValueError, match="micro_batch"):
        SFTConfig(micro_batch=-1).validate()


# ----- the commands -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def arith_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("arith")
    arith_base_run(root / "base", steps=4, n_docs=200)
    train, heldout = make_task()
    rows = lambda ps: [{"prompt": p.prompt, "response": p.response, "answer": p.answer} for p in ps]  # noqa: E731
    write_pairs(root / "train.jsonl", rows(train[:24]))
    write_pairs(root / "heldout.jsonl", rows(heldout[:6]))
    return root


def _run(module, argv):
    parser = argparse.ArgumentParser(prog=f"xtrain {module.__name__.rsplit('.', 1)[-1]}")
    module.configure_parser(parser)
    return module.run(parser.parse_args(argv))


def test_sft_then_grpo_then_export(arith_run, tmp_path, capsys):
    out = tmp_path / "sft"
    assert _run(sft, [str(arith_run / "base" / "run"), "--data", str(arith_run / "train.jsonl"),
                      "--heldout", str(arith_run / "heldout.jsonl"), "--steps", "4", "--batch-size", "8",
                      "--micro-batch", "3", "--eval-every", "2", "--max-new-tokens", "12",
                      "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "before: held-out loss" in text and "step 2: held-out loss" in text
    assert "SFT: loss" in text and "held-out accuracy" in text
    for name in ("config.json", "tokenizer.json", "checkpoints", "metrics.jsonl", "loss.png",
                 "samples.txt", "summary.json"):
        assert (out / name).exists(), name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and "heldout_accuracy" in rows[1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heldout_accuracy_before"] is not None and summary["steps"] == 4
    assert "===== before" in (out / "samples.txt").read_text()

    rl = tmp_path / "rl"
    assert _run(grpo, [str(out), "--reward", "arith+format", "--prompts", str(arith_run / "train.jsonl"),
                       "--heldout", str(arith_run / "heldout.jsonl"), "--steps", "2", "--group", "2",
                       "--prompts-per-step", "2", "--max-new-tokens", "12", "--eval-samples", "1",
                       "--eval-every", "1", "--eval-batches", "0", "--warmup", "2", "--aggregation", "constant",
                       "--out", str(rl), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "step 1: mean reward" in text and "greedy accuracy" in text and "6 held-out prompts" in text
    summary = json.loads((rl / "summary.json").read_text())
    assert summary["accuracy_before"] is not None and summary["heldout"] is True
    assert json.loads((rl / "config.json").read_text())["grpo"]["aggregation"] == "constant"

    assert main.main(["sample", str(rl), "--max-new-tokens", "5"]) == 0
    pytest.importorskip("transformers")
    assert main.main(["export", str(rl), "--out", str(tmp_path / "hf"), "--check", "--tokens", "8"]) == 0


def test_sft_task_arith_writes_its_splits(arith_run, tmp_path, capsys):
    out = tmp_path / "task"
    assert _run(sft, [str(arith_run / "base" / "run"), "--task", "arith", "--steps", "1", "--eval-every", "0",
                      "--max-new-tokens", "4", "--out", str(out), "--no-progress"]) == 0
    assert len(read_pairs(out / "train.jsonl")) == 2360 and len(read_pairs(out / "heldout.jsonl")) == 200
    assert "on 200 pairs" in capsys.readouterr().out


def test_sft_errors_are_one_line(arith_run, tmp_path, capsys):
    base = str(arith_run / "base" / "run")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\n{"prompt": 3, "response": "b"}\n')
    long = tmp_path / "long.jsonl"
    write_pairs(long, [{"prompt": "x " * 100, "response": "y"}])
    for argv, msg in [([base, "--data", str(tmp_path / "none.jsonl")], "pairs file not found"),
                      ([base, "--data", str(bad)], "bad.jsonl, line 2: no \"prompt\" string"),
                      ([base, "--data", str(long), "--out", str(tmp_path / "o")], "pair 1 is"),
                      ([str(tmp_path), "--task", "arith"], "no checkpoint under"),
                      ([base, "--task", "arith", "--steps", "0"], "steps must be >= 1")]:
        assert _run(sft, argv) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert _run(sft, [base, "--task", "arith", "--steps", "1", "--eval-every", "0", "--max-new-tokens", "2",
                      "--out", str(tmp_path / "twice"), "--no-progress"]) == 0
    assert _run(sft, [base, "--task", "arith", "--out", str(tmp_path / "twice")]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --data and --task exclude each other (argparse: exit 2)
        main.main(["sft", base, "--data", "x.jsonl", "--task", "arith"])


def test_grpo_arith_errors(arith_run, tmp_path, capsys):
    base = str(arith_run / "base" / "run")
    prompts = tmp_path / "p.txt"
    prompts.write_text("What is 2 + 2?\n")
    assert _run(grpo, [base, "--reward", "arith", "--prompts", str(prompts), "--steps", "1", "--group", "2",
                       "--eval-batches", "0", "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "no answer known for the prompt 'What is 2 + 2?'" in capsys.readouterr().err
    no_answer = tmp_path / "h.jsonl"
    write_pairs(no_answer, [{"prompt": "q"}])
    assert _run(grpo, [base, "--reward", "arith", "--heldout", str(no_answer)]) == 2
    assert "pair 1 has no \"answer\"" in capsys.readouterr().err
    assert _run(grpo, [base, "--reward", "arith", "--ddof", "2"]) == 2
    assert "ddof must be 0" in capsys.readouterr().err


def test_help_explains_the_commands(capsys):
    for cmd, words in (("sft", ["--data", "--task", "--micro-batch", "gradient accumulation", "held-out"]),
                       ("grpo", ["--reward", "arith", "--aggregation", "--no-std", "--ddof", "--loss"])):
        with pytest.raises(SystemExit):
            main.main([cmd, "--help"])
        text = capsys.readouterr().out
        assert all(w in text for w in words), (cmd, [w for w in words if w not in text])


def test_reference_probability_is_the_product_of_the_response_token_probabilities():
    from xtrain_lessons.training.posttrain.accuracy import reference_probability  # noqa: PLC0415
    from xtrain_lessons.training.posttrain.logprobs import token_logprobs  # noqa: PLC0415

    model = Model(PRESETS["test"], dtype=np.float64, seed=2)
    pairs = [([1, 2, 3], [4, 5]), ([6], [7, 8, 9]), ([10, 11], [12])]
    expected = []
    for p, r in pairs:  # one sequence at a time: the chain rule over the response tokens
        seq = np.array([p + r])
        lp = token_logprobs(model(seq[:, :-1]), seq[:, 1:]).numpy()[0]
        expected.append(np.exp(lp[len(p) - 1:].sum()))
    assert reference_probability(model, pairs, batch=2) == pytest.approx(np.mean(expected), rel=1e-12)
    # a model that has learned one answer samples it with probability close to 1
    sharp = Model(PRESETS["test"], seed=2)
    for_pairs = [([1, 2, 3], [4])] * 8
    sft_train(sharp, for_pairs, SFTConfig(steps=40, batch_size=8, lr=1e-2, warmup=2))
    assert reference_probability(sharp, for_pairs) > 0.9
