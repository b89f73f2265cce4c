"""The closed RL loop of ``agentcompact rl demo`` with a real small model, on one GPU.

Qwen2.5-0.5B-Instruct (a local folder: the GPU machine has no hub access) plays "carry the
key" through the engine's summary strategy, writing its own summaries
(``LocalSummarizer`` over the model in memory); episodes are recorded through the hooks
into an ``EpisodeCollector``, turned into rows in memory with GRPO advantages over each
task's group (``rows_from_events``: the rows ``agentcompact export`` would write) and
trained with the project's loss (``collate_step`` + ``policy_loss_from_hidden``, bf16
autocast, AdamW). Sampling is batched across the running episodes (``Lockstep``) with
``transformers``' ``generate`` (KV cache), logprobs from the raw logits at temperature 1.

Sized for under 8 minutes on one H100 (default: 6 iterations of 8 tasks x 8 rollouts,
12 filler turns, about 3 compactions per episode). Prints per iteration the reward, the
sampled tokens per second, the trained tokens per second and the peak GPU memory.

    python benchmarks/rl_loop_gpu.py --model /path/to/Qwen2.5-0.5B-Instruct
    python benchmarks/rl_loop_gpu.py --dry-run      # CPU, a tiny random Qwen2 (tests)

``--dry-run`` runs the same code on a CPU with a tiny randomly initialised Qwen2 and the
real Qwen tokenizer (``--tokenizer``, default the shared data's), 1 iteration of 2 x 2
rollouts, so the script cannot rot where no GPU is.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

from agentcompact.rl._carry_key import CarryKey, PolicySize, tiny_qwen2
from agentcompact.rl._loop import TorchPolicy
from agentcompact.rl.demo import DemoConfig, _run_arm, _Setup

_SHARED = Path(os.environ.get("AGENTCOMPACT_SHARED_DATA",
                              Path(__file__).resolve().parents[2] / "shared" / "data"))
QWEN_TOKENIZER = _SHARED / "tokenizers" / "qwen2.5-coder-0.5b-instruct"


class NamedKey(CarryKey):
    """Carry the key, graded on free text: the answer names the key and no other key."""

    def reward(self, spec: Any, answer: str) -> float:
        named = set(re.findall(r"\bk\d+\b", answer))
        return 1.0 if named == {spec.key} else 0.0


class DryRunKey(NamedKey):
    """The dry run's reward: a random model never names the key, so a seeded coin gives
    the groups different rewards and the training step runs (the code path, not a result)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "_coin", iter([1.0, 0.0] * 1000))

    def reward(self, spec: Any, answer: str) -> float:
        return float(next(self._coin))  # type: ignore[attr-defined]


class GeneratePolicy(TorchPolicy):
    """Batched sampling with ``generate`` (left-padded, KV cache) on the model's device."""

    def text(self, ids: Any) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=True)).strip()

    @torch.inference_mode()
    def sample_batch(self, requests: Any) -> list[tuple[list[int], list[float]]]:
        t0 = time.perf_counter()
        self.model.eval()
        device = next(self.model.parameters()).device
        width = max(len(p) for p, _ in requests)
        ids = torch.full((len(requests), width), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, (prompt, _) in enumerate(requests):
            ids[b, width - len(prompt):] = torch.tensor(prompt)
            mask[b, width - len(prompt):] = 1
        max_new = max(m for _, m in requests)
        out = self.model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True,
            temperature=self.temperature, top_k=0, top_p=1.0, max_new_tokens=max_new,
            eos_token_id=self.eos, pad_token_id=self.pad, output_logits=True,
            return_dict_in_generate=True)
        tokens = out.sequences[:, width:].cpu()
        logp = torch.log_softmax(torch.stack(out.logits, 1).float().cpu() / self.temperature, -1)
        results = []
        for b, (_, limit) in enumerate(requests):
            row, lps = [], []
            for t in range(min(limit, tokens.shape[1])):
                token = int(tokens[b, t])
                row.append(token)
                lps.append(float(logp[b, t, token]))
                if token == self.eos:
                    break
            results.append((row, lps))
        self.sampled_tokens += sum(len(r) for r, _ in results)
        self.sampling_s += time.perf_counter() - t0
        return results


def _peak_memory(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB GPU"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB RSS"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local Qwen2.5-0.5B-Instruct folder (or any causal "
                        "LM with a chat template)")
    parser.add_argument("--tokenizer", default=None, help="default: the model's; with "
                        "--dry-run the shared Qwen tokenizer")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--fillers", type=int, default=12)
    parser.add_argument("--max-new", type=int, default=24, help="tokens per turn")
    parser.add_argument("--trigger", type=int, default=400, help="trigger tokens")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, a tiny random Qwen2, 1 iteration of 2 x 2 rollouts")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.dry_run:
        device = "cpu"
        hf = AutoTokenizer.from_pretrained(str(args.tokenizer or QWEN_TOKENIZER))
        model = tiny_qwen2(len(hf), PolicySize(hidden=16, layers=1, heads=2, kv_heads=1,
                                               intermediate=32, max_positions=4096), 0)
        args.iterations, args.groups, args.samples, args.max_new = 1, 2, 2, 4
        args.trigger, args.fillers = 100, 6
    else:
        if not args.model:
            parser.error("--model is required (or --dry-run)")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        hf = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model.to(device)
    config = DemoConfig(iterations=args.iterations, groups=args.groups, samples=args.samples,
                        fillers=args.fillers, trigger_tokens=args.trigger,
                        target_tokens=args.trigger * 3 // 4, lr=args.lr, max_new=args.max_new,
                        micro_batch=8, ppo_epochs=1, arms=("trained",))
    setup = _Setup(config, hf=hf, name=str(args.tokenizer or args.model or QWEN_TOKENIZER))
    setup.task = (DryRunKey if args.dry_run else NamedKey)(
        keys=config.keys, words=config.words, fillers=config.fillers)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    last = [t0, 0, 0]

    def progress(line: str) -> None:
        now = time.perf_counter()
        print(f"{line} | {_peak_memory(device)} peak | {now - last[0]:.1f} s", flush=True)
        last[0] = now

    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda"
                else torch.autocast("cpu", enabled=False))
    with autocast:
        curve = _run_arm(setup, "trained", model, 0, progress, policy_cls=GeneratePolicy,
                         device=device)
    wall = time.perf_counter() - t0
    print(f"device {device}; {args.iterations} iterations of {args.groups} x {args.samples} "
          f"rollouts in {wall:.1f} s; sampled {curve.sampled_tokens} tokens, "
          f"{curve.sampled_tokens / max(wall, 1e-9):.0f} tokens/s over the whole loop; "
          f"largest micro-batch {curve.peak_batch_tokens} tokens; peak {_peak_memory(device)}")
    print("rewards:", " ".join(f"{r:.2f}" for r in curve.rewards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
