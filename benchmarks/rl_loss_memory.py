"""Peak memory of one policy-loss step (forward + backward): chunked vs full softmax.

One row of ``--tokens`` tokens (default 32,768) whose last ``--response`` tokens are
sampled (mask 1), a ``--vocab`` vocabulary (default 152,064: Qwen2.5), hidden size
``--hidden`` (memory of the logits does not depend on it; a small one keeps CPU time low).
Each variant runs in a fresh subprocess; the figure is the growth of the peak RSS over the
inputs alone (hidden states, lm_head weight and its gradient are allocated first).

* chunked: ``policy_loss_from_hidden`` (response positions only, 2048 × 16384 blocks);
* full: ``log_softmax`` over every position of ``hidden @ W^T`` (the old ``policy_loss``),
  measured at ``--full-tokens`` (default 2,048) and extrapolated linearly to ``--tokens``
  (it does not fit in this machine's memory at 32k: about 3 × T × V × 4 bytes).

    python benchmarks/rl_loss_memory.py [--tokens 32768 --response 8192 --vocab 152064]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = r"""
import json, resource, sys
import torch
mode = sys.argv[1]
T, R, V, H = map(int, sys.argv[2:6])
torch.manual_seed(0)
hidden = torch.randn(1, T, H, requires_grad=True)
weight = (torch.randn(V, H) * 0.02).requires_grad_()
weight.grad = torch.zeros_like(weight); hidden.grad = torch.zeros_like(hidden)
ids = torch.randint(0, V, (1, T))
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = rss()
if mode == "chunked":
    from agentcompact.rl.ppo import policy_loss_from_hidden
    mask = torch.zeros(1, T); mask[0, T - R:] = 1
    batch = {"input_ids": ids, "loss_mask": mask, "old_logprobs": torch.full((1, T), -11.9) * mask,
             "advantages": mask * 0.5, "token_weights": mask / R,
             "logprobs_known": torch.tensor([True]), "response_start": torch.tensor([T - R])}
    loss = policy_loss_from_hidden(hidden, weight, batch)
else:
    logp = torch.log_softmax((hidden @ weight.T)[:, :-1].float(), -1)
    logp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = torch.exp(logp[:, T - R - 1:] + 11.9)
    loss = -(ratio * 0.5).mean()
loss.backward()
print(json.dumps({"peak_growth": rss() - base, "loss": float(loss)}))
"""


def _run(mode: str, tokens: int, response: int, vocab: int, hidden: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(tokens), str(response),
                          str(vocab), str(hidden)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--response", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--full-tokens", type=int, default=2048)
    a = p.parse_args()
    gib = float(1 << 30)
    chunked = _run("chunked", a.tokens, a.response, a.vocab, a.hidden)
    small = _run("full", a.full_tokens, min(a.response, a.full_tokens // 2), a.vocab, a.hidden)
    full_est = small["peak_growth"] * a.tokens / a.full_tokens
    logits = a.tokens * a.vocab * 4
    print(f"row {a.tokens} tokens ({a.response} sampled), vocab {a.vocab}, hidden {a.hidden}: "
          "peak RSS growth of one forward+backward over the inputs")
    print(f"  chunked (response positions, 2048x16384 blocks): "
          f"{chunked['peak_growth'] / gib:7.2f} GiB")
    print(f"  full softmax measured at {a.full_tokens} tokens:      "
          f"{small['peak_growth'] / gib:7.2f} GiB")
    print(f"  full softmax at {a.tokens} tokens, extrapolated:   {full_est / gib:7.2f} GiB "
          f"(one fp32 logits tensor alone: {logits / gib:.2f} GiB)")
    print(f"  ratio full / chunked: {full_est / max(chunked['peak_growth'], 1):.1f}x")


if __name__ == "__main__":
    main()
