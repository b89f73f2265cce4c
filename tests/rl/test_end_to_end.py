"""A recorded run → ``agentcompact export --recompute-logprobs`` → training on CPU.

The run is written by the real Recorder (a compacted episode with a policy-written summary,
and an uncompacted one); the export runs through the CLI with a tiny random Qwen2 saved to
disk as the recompute model; the exported rows then train that model with our loss (which
must fall over four steps) and load into verl's ``DataProto``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")
transformers = pytest.importorskip("transformers")

from agentcompact import EpisodeEnd  # noqa: E402
from agentcompact.rl.ppo import policy_loss_from_hidden  # noqa: E402
from agentcompact.rl.torch_data import collate  # noqa: E402
from agentcompact.trajectory._export_cli import main as export_main  # noqa: E402
from agentcompact.trajectory.export import read_export  # noqa: E402
from tests.trajectory.runs import agent_loop, record  # noqa: E402

from .rowkit import QWEN_TOKENIZER  # noqa: E402

pytestmark = pytest.mark.skipif(not QWEN_TOKENIZER.exists(),
                                reason=f"tokenizer absent: {QWEN_TOKENIZER}")


def _tiny_qwen(path: Path) -> Any:
    tok = transformers.AutoTokenizer.from_pretrained(str(QWEN_TOKENIZER))
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
        tie_word_embeddings=True, attn_implementation="eager")
    model = transformers.Qwen2ForCausalLM(config)
    model.save_pretrained(str(path))
    return model


def train_steps(model: Any, batch: dict[str, Any], steps: int, lr: float = 1e-2) -> list[float]:
    """Adam steps of our chunked loss on one collated batch; the loss of each step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             position_ids=batch["position_ids"]).last_hidden_state
        loss = policy_loss_from_hidden(hidden, model.lm_head.weight, batch, vocab_chunk=40000)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _export(tmp_path: Path, *extra: str) -> list[dict[str, Any]]:
    run = tmp_path / "run"
    record(run, [agent_loop("e0", 4, compact_at=2, trained_summary=True),
                 agent_loop("e1", 3)],
           [EpisodeEnd(episode_id="e0", reward=1.0, group_id="task-0", sample_index=0),
            EpisodeEnd(episode_id="e1", reward=0.0, group_id="task-0", sample_index=1)])
    out = tmp_path / "out"
    code = export_main([str(run), "--out", str(out), "--tokenizer", str(QWEN_TOKENIZER),
                        "--no-progress", "--workers", "1", *extra])
    assert code == 0
    return read_export(out)


def test_export_without_logprobs_is_refused_by_the_loss(tmp_path: Path) -> None:
    from agentcompact.errors import ExportError

    rows = _export(tmp_path)
    assert all(r["sampling"]["logprobs_mode"] == "none" for r in rows)
    batch = collate(rows, pad_token_id=0)
    hidden = torch.zeros(*batch["input_ids"].shape, 4)
    with pytest.raises(ExportError, match="no rollout logprobs"):
        policy_loss_from_hidden(hidden, torch.zeros(10, 4), batch)


def test_recomputed_logprobs_train_and_load_into_verl(tmp_path: Path) -> None:
    model = _tiny_qwen(tmp_path / "model")
    rows = _export(tmp_path, "--recompute-logprobs", str(tmp_path / "model"),
                   "--recompute-batch-tokens", "64")
    # e0 compacted once: its two windows plus the policy-written summary in its own context
    assert [(r["episode_id"], r["summary_trained"]) for r in rows] == [
        ("e0", False), ("e0", True), ("e0", False), ("e1", False)]
    assert all(r["sampling"]["logprobs_mode"] == "recomputed" for r in rows)
    for r in rows:
        lp = torch.tensor(r["rollout_logprobs"])
        mask = torch.tensor(r["response_mask"]).bool()
        assert (lp[~mask] == 0).all() and (lp[mask] < 0).all()
    batch = collate(rows, pad_token_id=0)
    # the recomputed values are the model's own: step 0 has ratio 1 everywhere
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    full = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])
    sel = batch["response_mask"][:, 1:] > 0
    assert torch.allclose(full.squeeze(-1)[sel], batch["old_logprobs"][:, 1:][sel], atol=1e-4)

    losses = train_steps(model, batch, 4)
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses

    protocol = pytest.importorskip("verl.protocol")
    from agentcompact.rl.adapters import to_verl

    data = protocol.DataProto.from_single_dict(to_verl(rows, pad_token_id=0))
    assert data.batch["old_log_probs"].shape == data.batch["responses"].shape
    assert (data.batch["old_log_probs"] * data.batch["response_mask"] < 0).any()
