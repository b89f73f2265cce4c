"""SkyRL's own trainer takes a batch from ``CompactingGenerator`` and trains one step.

Real: SkyRL's ``RayPPOTrainer.train`` (its dataloader, ``generate`` and generator-output
validation, step-wise postprocessing, ``convert_to_training_input``, the policy forward for
old logprobs, step-wise GRPO advantages, advantage normalization for ``token_mean``, the
mini-batch loop) and its ``PolicyWorkerBase`` (``forward``, ``forward_backward`` with its
PPO loss, ``optim_step``) on SkyRL's ``HFModelWrapper``. Stubbed: the inference engine
(it samples the same tiny model, so its weights are the trainer's) and what only moves
data between Ray actors and GPUs (the dispatch, the distributed strategy)."""

from __future__ import annotations

import math
import sys
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("skyrl")
pytest.importorskip("skyrl_gym")
pytest.importorskip("peft")  # SkyRL's model wrapper imports it

from .tinylm import byte_tokenizer, eos_ids, tiny_lm  # noqa: E402


@contextmanager
def _skyrl_imports() -> Iterator[None]:
    """skyrl 0.3.0 needs typing_extensions' TypedDict for pydantic before Python 3.12
    (see agentcompact.rl.skyrl._import_skyrl); its model wrapper imports flash-attn's
    padding helpers at module level (CUDA kernels, not installable on a CPU machine), which
    it calls only with ``remove_microbatch_padding``: off here, so they are left undefined."""
    saved = typing.TypedDict
    if sys.version_info < (3, 12):
        import typing_extensions

        typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
    stubbed = _stub_flash_attn()
    try:
        yield
    finally:
        typing.TypedDict = saved  # type: ignore[misc]
        for name in stubbed:
            sys.modules.pop(name, None)


def _stub_flash_attn() -> list[str]:
    import importlib.util
    import types

    if importlib.util.find_spec("flash_attn") is not None:
        return []

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("flash-attn is not installed (remove_microbatch_padding needs it)")

    padding = types.ModuleType("flash_attn.bert_padding")
    padding.pad_input = padding.unpad_input = unavailable  # type: ignore[attr-defined]
    root = types.ModuleType("flash_attn")
    root.bert_padding = padding  # type: ignore[attr-defined]
    sys.modules.update({"flash_attn": root, "flash_attn.bert_padding": padding})
    return ["flash_attn", "flash_attn.bert_padding"]


with _skyrl_imports():
    from skyrl.backends.skyrl_train.distributed.dispatch import MeshRank  # noqa: E402
    from skyrl.backends.skyrl_train.inference_servers.base import (  # noqa: E402
        InferenceEngineInterface,
    )
    from skyrl.backends.skyrl_train.workers.model_wrapper import HFModelWrapper  # noqa: E402
    from skyrl.backends.skyrl_train.workers.worker import PolicyWorkerBase  # noqa: E402
    from skyrl.train.config import SkyRLTrainConfig  # noqa: E402
    from skyrl.train.trainer import RayPPOTrainer  # noqa: E402
    from skyrl.train.utils.tracking import Tracking  # noqa: E402
    from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

    from agentcompact.rl.generate import TransformersSampler  # noqa: E402
    from agentcompact.rl.rollout import RolloutSettings, SamplingSettings, TriggerDraw  # noqa: E402
    from agentcompact.rl.skyrl import CompactingGenerator  # noqa: E402

ENV = "agentcompact-test-tools"


class ToolsEnv(BaseTextEnv):  # type: ignore[misc]
    """A skyrl-gym environment: a fixed tool result per response until ``max_turns``;
    reward 1.0 when the responses held more ``a`` than ``b`` bytes."""

    def __init__(self, env_config: Any = None, extras: Any = None) -> None:
        super().__init__()
        self.max_turns = int((extras or {}).get("max_turns", 3))
        self.a = self.b = 0

    def step(self, action: str) -> Any:
        self.turns += 1
        self.a, self.b = self.a + action.count("a"), self.b + action.count("b")
        if self.turns >= self.max_turns:
            return {"observations": [], "reward": float(self.a > self.b), "done": True,
                    "metadata": {}}
        return {"observations": [{"role": "user", "content": f"tool {self.turns}: " + "o" * 60}],
                "reward": 0.0, "done": False, "metadata": {}}


class TinyEngine(InferenceEngineInterface):  # type: ignore[misc]
    """The stub inference engine: token ids in, the tiny model's samples out."""

    def __init__(self, model: Any, tok: Any) -> None:
        self.sampler = TransformersSampler(model, eos_token_ids=eos_ids(tok),
                                           pad_token_id=tok.pad_token_id)
        self.calls: list[dict[str, Any]] = []
        self.tok = tok

    @property
    def model_name(self) -> str:
        return "tiny"

    async def generate(self, input_batch: Any, model: str | None = None) -> Any:
        params = input_batch["sampling_params"] or {}
        self.calls.append(dict(params))
        settings = SamplingSettings(temperature=float(params.get("temperature", 1.0)),
                                    max_tokens=int(params["max_tokens"]))
        outs = [self.sampler.sample(list(p), settings)
                for p in input_batch["prompt_token_ids"]]
        return {"responses": [self.tok.decode(o.token_ids, skip_special_tokens=True)
                              for o in outs],
                "response_ids": [list(o.token_ids) for o in outs],
                "stop_reasons": [o.stop_reason for o in outs],
                "response_logprobs": [list(o.logprobs or []) for o in outs]}

    async def finish_session(self, session_id: str) -> None:
        return None

    def get_endpoint_url(self) -> str:
        raise NotImplementedError

    async def chat_completion(self, request_payload: Any) -> Any:
        raise NotImplementedError

    async def render_chat_completion(self, request_payload: Any) -> Any:
        raise NotImplementedError

    async def completion(self, request_payload: Any) -> Any:
        raise NotImplementedError

    async def wake_up(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def sleep(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def init_weight_update_communicator(self, init_info: Any) -> None:
        return None

    async def update_named_weights(self, request: Any) -> None:
        return None

    async def teardown(self) -> None:
        return None

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> None:
        return None

    async def pause_generation(self) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def get_world_size(self) -> tuple[int, int]:
        return 1, 1


class CpuStrategy:
    """What PolicyWorkerBase asks of its distributed strategy, on one CPU process."""

    def backward(self, loss: Any, model: Any, optimizer: Any, **kwargs: Any) -> None:
        loss.backward()

    def optimizer_step(self, optimizer: Any, model: Any, scheduler: Any, name: str = "model",
                       **kwargs: Any) -> Any:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        return norm

    def all_reduce(self, data: Any, op: str = "mean", group: Any = None) -> Any:
        return data

    def is_rank_0(self) -> bool:
        return True


class InProcessDispatch:
    """SkyRL's WorkerDispatch for one in-process policy worker (no Ray, no GPU)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.steps = 0

    def get_lcm_dp_size(self) -> int:
        return 1

    def dp_size(self, model: str) -> int:
        return 1

    def init_weight_sync_state(self, client: Any) -> None:
        return None  # the engine samples the trainer's own module: nothing to sync

    async def save_weights_for_sampler(self, model_id: Any = None) -> None:
        return None

    def forward(self, model: str, data: Any, **kwargs: Any) -> Any:
        return self.worker.forward(data)

    def forward_from_staged(self, model: str, chunks: list[Any], **kwargs: Any) -> Any:
        return self.worker.forward(chunks[0])

    def stage_data(self, model: str, data: Any, boundaries: Any) -> list[list[Any]]:
        return [[data[start:end]] for start, end in boundaries]

    def forward_backward_from_staged(self, model: str, chunks: list[Any], **kwargs: Any) -> Any:
        return self.worker.forward_backward(chunks[0])

    def optim_step(self, model: str, model_id: Any = None) -> Any:
        self.steps += 1
        return self.worker.optim_step()

    def empty_cache(self, model: Any = None) -> None:
        return None


class Prompts:
    """Two tasks in SkyRL's dataset item shape (messages, env class, extras, uid)."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> Any:
        return ([{"role": "user", "content": f"task {i}: " + "q" * 30}], ENV, {}, f"task{i}")

    def collate_fn(self, items: list[Any]) -> list[dict[str, Any]]:
        return [{"prompt": p, "env_class": e, "env_extras": x, "uid": u} for p, e, x, u in items]


def _config(tmp_path: Path) -> Any:
    cfg = SkyRLTrainConfig()
    t, g, a = cfg.trainer, cfg.generator, cfg.trainer.algorithm
    t.train_batch_size = t.policy_mini_batch_size = 2
    t.micro_train_batch_size_per_gpu = t.micro_forward_batch_size_per_gpu = 4
    t.epochs, t.max_training_steps = 1, 1
    t.ckpt_interval = t.hf_save_interval = t.eval_interval = 0
    t.print_example_interval = 0
    t.placement.policy_num_gpus_per_node = 1
    t.export_path = str(tmp_path / "export")
    a.advantage_estimator, a.loss_reduction, a.policy_loss_type = "grpo", "token_mean", "regular"
    a.use_kl_loss, a.temperature = False, 1.0
    g.step_wise_trajectories, g.batched, g.n_samples_per_prompt = True, False, 2
    g.max_turns, g.max_input_length = 6, 2048
    g.sampling_params.max_generate_length, g.sampling_params.logprobs = 10, 0
    g.inference_engine.enable_ray_prometheus_stats = False  # no Ray cluster to scrape
    cfg.environment.env_class = ENV
    cfg.data.dataloader.num_workers = 0
    return cfg


def _worker(cfg: Any, model: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        # the worker sets them (accelerate then takes a later test for a CPU cluster):
        # setenv records each one's state so that monkeypatch restores it after the test
        monkeypatch.setenv(var, "")
    worker = PolicyWorkerBase(cfg=cfg.trainer, world_size=1, rank=0, local_rank=0,
                              master_addr="localhost", master_port=12345,
                              sequence_parallel_size=1)
    worker.model = HFModelWrapper(model, bf16=False)
    worker.optimizer = torch.optim.AdamW(worker.model.parameters(), lr=1e-2)
    worker.scheduler = torch.optim.lr_scheduler.LambdaLR(worker.optimizer, lambda _: 1.0)
    worker.strategy = CpuStrategy()
    worker.mesh_rank = MeshRank(dp=0, sp=0, tp=0, pp=0, world_size=1, dp_size=1, pp_size=1)
    worker.device_mesh = type("Mesh", (), {"get_group": lambda self, name: None})()
    return worker


@pytest.fixture
def skyrl_env() -> Iterator[None]:
    import skyrl_gym
    from skyrl_gym.envs.registration import registry

    skyrl_gym.register(id=ENV, entry_point=ToolsEnv)
    try:
        yield
    finally:
        registry.pop(ENV, None)


# SkyRL's worker autocasts to CUDA and asks torch for the current CUDA device; on a CPU-only
# torch autocast warns and disables itself, and the device is the CPU
@pytest.mark.filterwarnings("ignore:User provided device_type of 'cuda'")
@pytest.mark.filterwarnings("ignore:CUDA is not available or torch_xla is imported")
# torchdata's StatefulDataLoader (SkyRL's) calls torch.set_vital, deprecated in torch 2.13
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_skyrl_trainer_trains_one_step_on_compacted_step_wise_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skyrl_env: None) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    tok = transformers.AutoTokenizer.from_pretrained(str(byte_tokenizer(tmp_path / "tok")))
    model = tiny_lm(seed=3)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = _config(tmp_path)
    engine = TinyEngine(model, tok)
    seen: list[Any] = []
    generator = CompactingGenerator(
        cfg.generator, cfg.environment.skyrl_gym, engine, tok,
        rollout=RolloutSettings(trigger=TriggerDraw(260, 0.9, 1.1, seed=7)))
    inner = generator.generate

    async def spy(batch: Any) -> Any:
        out = await inner(batch)
        seen.append(out)
        return out

    generator.generate = spy  # type: ignore[method-assign]
    tracker, logged = Tracking("t", "t", backend="console"), []
    log = tracker.log

    def keep(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        logged.append(dict(data))
        log(data, *args, **kwargs)

    tracker.log = keep  # type: ignore[method-assign]
    trainer = RayPPOTrainer(cfg, tracker=tracker, tokenizer=tok,
                            train_dataset=Prompts(), inference_engine_client=engine,
                            generator=generator)
    dispatch = InProcessDispatch(_worker(cfg, model, monkeypatch))
    trainer.dispatch = dispatch
    import asyncio

    asyncio.run(trainer.train())

    assert dispatch.steps == 1 and trainer.global_step == 1
    out = seen[0]
    last = out["is_last_step"]
    assert sum(last) == 4  # 2 tasks x 2 samples: one last step per episode
    assert len(last) > 4  # compacted episodes: several segments (rows) each
    assert all(c["logprobs"] == 0 for c in engine.calls)  # logprobs asked of the engine
    step = next(x for x in logged if "policy/policy_loss" in x)
    assert math.isfinite(step["policy/policy_loss"]) and step["policy/grad_norm"] > 0
    # the rows' ids and logprobs are the policy's own: SkyRL's forward recomputes them
    assert step["policy/rollout_train_logprobs_abs_diff_max"] < 1e-4
    assert step["generate/batch_num_seq"] == len(last)
    changed = [not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters(),
                                                             strict=True)]
    assert any(changed)
