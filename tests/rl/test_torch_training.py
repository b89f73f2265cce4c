"""SegmentDataset / collate / policy_loss, and a real CPU training step on a tiny Qwen2."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from agentcompact.errors import ExportError
from agentcompact.rl import assign_advantages
from agentcompact.rl._schema import to_float32, validate_rows, write_parquet
from agentcompact.rl.ppo import policy_loss
from agentcompact.rl.torch_data import (
    SegmentDataset,
    batch_token_weights,
    collate,
    move_to,
)

from .rowkit import QWEN_TOKENIZER, make_episode, make_row

PAD = 0


def test_collate_layout_by_hand() -> None:
    a = make_row(episode_id="a", prompt_ids=[5, 6], response_ids=[7, 8, 9],
                 response_mask=[1, 0, 1], rollout_logprobs=[-0.5, 0.0, -0.25],
                 advantages=[2.0, 0.0, 2.0], episode_num_loss_tokens=2)
    b = make_row(episode_id="b", sample_index=1, prompt_ids=[3], response_ids=[4],
                 response_mask=[1], rollout_logprobs=[-1.0], advantages=[-1.0],
                 episode_num_loss_tokens=1)
    out = collate([a, b], pad_token_id=PAD)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9], [3, 4, 0, 0, 0]]
    assert out["attention_mask"].tolist() == [[1] * 5, [1, 1, 0, 0, 0]]
    assert out["position_ids"].tolist()[0] == [0, 1, 2, 3, 4]
    assert out["position_ids"].tolist()[1][:2] == [0, 1]
    assert out["response_start"].tolist() == [2, 1]
    assert out["response_mask"].tolist() == [[0, 0, 1, 0, 1], [0, 1, 0, 0, 0]]
    assert out["old_logprobs"].tolist() == [[0, 0, -0.5, 0, -0.25], [0, -1.0, 0, 0, 0]]
    assert out["advantages"].tolist() == [[0, 0, 2.0, 0, 2.0], [0, -1.0, 0, 0, 0]]
    third = pytest.approx(1 / 3)
    assert out["token_weights"].tolist() == [[0, 0, third, 0, third], [0, third, 0, 0, 0]]
    seq = collate([a, b], pad_token_id=PAD, mode="seq-mean-token-mean")["token_weights"]
    assert seq.tolist() == [[0, 0, 0.25, 0, 0.25], [0, 0.5, 0, 0, 0]]
    assert torch.equal(batch_token_weights(out, "seq-mean-token-mean"), seq)
    with pytest.raises(ExportError, match="empty prompt"):
        collate([dict(a, prompt_ids=[])], pad_token_id=PAD)


def test_masked_episode_has_no_loss_tokens() -> None:
    rows = make_episode("m", [[1, 1]], mask_episode=True)
    out = collate(rows, pad_token_id=PAD)
    assert out["loss_mask"].sum() == 0 and out["response_mask"].sum() == 2
    assert out["token_weights"].sum() == 0


def test_policy_loss_matches_a_hand_computation() -> None:
    # One row: prompt [0], response [1, 2] (both mask 1), vocabulary of 3.
    row = make_row(prompt_ids=[0], response_ids=[1, 2], response_mask=[1, 1],
                   rollout_logprobs=[math.log(0.5), math.log(0.25)], advantages=[1.0, -1.0],
                   episode_num_loss_tokens=2)
    batch = collate([row], pad_token_id=PAD)
    probs = [[0.2, 0.7, 0.1], [0.3, 0.3, 0.4], [1 / 3] * 3]  # position 0 predicts token 1, ...
    logits = torch.log(torch.tensor([probs]))
    # ratios: 0.7/0.5 = 1.4 (A=+1, clipped at 1.2), 0.4/0.25 = 1.6 (A=-1, unclipped max)
    expected = 0.5 * -min(1.4, 1.2) + 0.5 * 1.6
    assert policy_loss(logits, batch).item() == pytest.approx(expected, rel=1e-6)
    high = 0.5 * -1.4 + 0.5 * 1.6  # clip-higher 0.5 lets the first ratio through
    assert policy_loss(logits, batch, clip_eps_high=0.5).item() == pytest.approx(high, rel=1e-6)


def test_clipped_tokens_get_no_gradient() -> None:
    row = make_row(prompt_ids=[0], response_ids=[1], response_mask=[1],
                   rollout_logprobs=[math.log(0.25)], advantages=[1.0],
                   episode_num_loss_tokens=1)
    batch = collate([row], pad_token_id=PAD)
    logits = torch.log(torch.tensor([[[0.1, 0.8, 0.1], [0.3, 0.4, 0.3]]])).requires_grad_()
    policy_loss(logits, batch).backward()  # ratio 3.2 > 1.2 with A > 0: clipped
    assert logits.grad is not None and torch.count_nonzero(logits.grad) == 0


def test_dataset_from_rows_and_parquet(tmp_path: Path) -> None:
    rows = to_float32(make_episode("e", [[1, 0], [1, 1]]))
    write_parquet(rows, tmp_path / "seg.parquet")
    from_file = SegmentDataset(tmp_path / "seg.parquet")
    assert len(from_file) == 2 and from_file[1]["response_mask"] == [1, 1]
    assert SegmentDataset(rows)[0]["episode_id"] == "e"
    with pytest.raises(ExportError):
        SegmentDataset([dict(rows[0], segment_index=5)])
    loader = torch.utils.data.DataLoader(
        from_file, batch_size=2, collate_fn=lambda b: collate(b, pad_token_id=PAD))
    (batch,) = list(loader)
    assert move_to(batch, "cpu")["input_ids"].shape[0] == 2


# --------------------------------------------------------------------------- real training


def chat_segment(tok, prompt_messages, turns):
    """prompt_ids from the chat template; response = sampled turns (mask 1, ending on
    <|im_end|>) and template glue + tool output (mask 0)."""
    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    prompt = enc(tok.apply_chat_template(prompt_messages, tokenize=False,
                                         add_generation_prompt=True))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    response, mask = [], []
    for role, text in turns:
        ids = enc(text) + [im_end] if role == "assistant" else enc(
            f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        response += ids
        mask += [int(role == "assistant")] * len(ids)
    full = tok.apply_chat_template(prompt_messages + [{"role": r, "content": t} for r, t in turns],
                                   tokenize=False)
    assert tok.decode(prompt + response) + "\n" == full  # cross-check against the template
    return prompt, response, mask


def build_rows(tok):
    task = {"role": "user", "content": "Fix the failing test in utils.py."}
    win = [
        chat_segment(tok, [task], [
            ("assistant", "Let me read utils.py first."),
            ("user", "def add(a, b):\n    return a - b"),
            ("assistant", "The bug: add() subtracts. I will fix it."),
        ]),
        chat_segment(tok, [{"role": "user", "content": task["content"] + "\n\nSummary so far: "
                            "add() in utils.py subtracted; the fix is identified."}],
                     [("assistant", "Applied the fix: return a + b. Tests pass.")]),
    ]
    loss = [chat_segment(tok, [task], [
        ("assistant", "The bug is probably in main.py."),
        ("user", "cat: main.py: No such file or directory"),
        ("assistant", "I give up."),
    ])]
    rows = []
    for eid, segs, reward, index in (("win", win, 1.0, 0), ("loss", loss, 0.0, 1)):
        template = make_episode(eid, [m for _, _, m in segs], reward=reward, sample_index=index)
        for row, (p, r, m) in zip(template, segs, strict=True):
            rows.append(dict(row, prompt_ids=p, response_ids=r, response_mask=m,
                             tokenizer_name="Qwen/Qwen2.5-Coder-0.5B-Instruct"))
    return rows


def with_policy_logprobs(model, rows, pad):
    """Replace rollout_logprobs by the (initial) model's own, as a rollout engine would."""
    batch = collate(rows, pad_token_id=pad)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(
        -1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    out = []
    for b, row in enumerate(rows):
        s, n = int(batch["response_start"][b]), len(row["response_ids"])
        lp = logp[b, s - 1:s - 1 + n] * torch.tensor(row["response_mask"])
        out.append(dict(row, rollout_logprobs=lp.tolist()))
    return to_float32(out)


@pytest.mark.skipif(not QWEN_TOKENIZER.exists(), reason=f"tokenizer absent: {QWEN_TOKENIZER}")
def test_real_training_steps_on_cpu_decrease_the_loss() -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=256, tie_word_embeddings=True,
                         attn_implementation="eager")
    model = Qwen2ForCausalLM(config)
    rows = assign_advantages(with_policy_logprobs(model, build_rows(tok), tok.pad_token_id))
    validate_rows(rows)
    batch = collate(SegmentDataset(rows), pad_token_id=tok.pad_token_id)

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(4):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
        loss = policy_loss(logits, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # Step 0: ratio = 1 because old_logprobs are the policy's own (checks the logit shift).
    w, adv = batch["token_weights"], batch["advantages"]
    assert losses[0] == pytest.approx(-(w * adv).sum().item(), abs=1e-5)
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.05, losses
    assert losses == sorted(losses, reverse=True), losses  # small lr: every step improves
