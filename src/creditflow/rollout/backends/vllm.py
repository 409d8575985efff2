"""The ``vllm`` rollout backend: completions drawn by a vLLM engine that holds its own copy of
the policy's weights (docs/vllm.md).

Two modes, as in TRL's ``vllm_mode``:

- ``colocate``: a ``vllm.LLM`` in the trainer's own process, built on first use from the
  module's config (``load_format="dummy"``: nothing is read from disk) and given the module's
  weights by ``load_weights``, in place, through the worker's ``reload_weights`` with a
  ``(name, tensor)`` iterator (vLLM 0.32's in-place reload; TRL's ``_move_model_to_vllm``
  calls the model runner's ``load_weights`` the same way). The engine runs in process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the tensors are handed over, not serialised.
- ``server``: a running ``python -m vllm.entrypoints.openai.api_server`` with
  ``VLLM_SERVER_DEV_MODE=1`` (the weight and cache endpoints are dev-mode routes).
  Completions come from ``/v1/completions`` with token-id prompts; weights go through
  vLLM's own RL endpoints: ``weight_sync="nccl"`` broadcasts them over NCCL
  (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
  ``/finish_weight_update``; the server needs ``--weight-transfer-config
  '{"backend": "nccl"}'`` and a GPU of its own), ``weight_sync="disk"`` writes a safetensors
  checkpoint to a folder the server can read and calls ``/collective_rpc`` ``reload_weights``
  on it (same host or a shared filesystem; it runs on CPU).

In both modes a sample is drawn with the sampler the request names and nothing else: the
checkpoint's generation config is ignored (``generation_config="vllm"``), only the request's
stop ids end a completion (``ignore_eos``), and the sampled token's log-prob is the one after
temperature, top-k and top-p (``logprobs_mode="processed_logprobs"``, as TRL sets it for its
importance-sampling correction). The per-request seed is drawn from torch's global RNG, so a
seeded run draws the same completions again.

vLLM is an optional dependency with its own environment (``make install-vllm`` builds
``.venv-vllm``); this module imports it only inside the methods that use it.

Shape symbols: N prompts, G completions per prompt, B = N * G rows (the G rows of a prompt
consecutive), P prompt tokens (left-padded), T completion tokens (right-padded).
"""

# vLLM (and requests, its HTTP client) are imported inside the methods that use them: this
# module must import where vLLM is not installed.
# ruff: noqa: PLC0415

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch
from transformers import PreTrainedModel

from creditflow.errors import ConfigError
from creditflow.rollout.backends.base import (
    Generation,
    GenerationRequest,
    completion_mask_from_eos,
    finish_reasons,
)
from creditflow.rollout.modules import bare_module

logger = logging.getLogger(__name__)

MODES = ("colocate", "server")
WEIGHT_SYNCS = ("auto", "nccl", "disk")
DTYPES = ("auto", "float32", "bfloat16", "float16")
VLLM_MISSING = (
    "the 'vllm' rollout backend needs vLLM, which is not installed in this environment. "
    "vLLM pins its own torch and transformers, so it lives in an environment of its own: "
    "build it with `make install-vllm` (.venv-vllm) and run from it (`make test-vllm`, "
    "`.venv-vllm/bin/python ...`); see docs/vllm.md"
)
# Prefixes a wrapper adds to parameter names that vLLM's checkpoint loader does not know
# (torch's activation-checkpoint wrapper; TRL strips the same one).
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.",)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def import_vllm():
    """The ``vllm`` package, or an ImportError saying how to get it."""
    try:
        import vllm  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)
    except ImportError as error:
        raise ImportError(VLLM_MISSING) from error
    return vllm


def checkpoint_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every weight under its checkpoint name (what vLLM's loaders
    expect). Tied weights appear under both names: vLLM 0.32's in-place reload of a tied
    model leaves the head stale unless ``lm_head.weight`` comes too."""
    for wrapped_name, tensor in model.state_dict().items():
        name = wrapped_name
        for prefix in WRAPPER_PREFIXES:
            name = name.replace(prefix, "")
        yield name, tensor.detach()


def save_checkpoint(model: torch.nn.Module, folder: str) -> None:
    """``model``'s config and every weight of ``checkpoint_weights`` (tied ones under both
    names) as one safetensors file in ``folder``. Not ``save_pretrained``: it drops the tied
    ``lm_head.weight``, and vLLM 0.32's in-place reload of a tied model then leaves the old
    head in place."""
    from safetensors.torch import save_file  # noqa: PLC0415 - only when weights are pushed to vLLM

    os.makedirs(folder, exist_ok=True)
    model.config.save_pretrained(folder)
    weights: dict[str, torch.Tensor] = {}
    stored: set[int] = set()
    for name, tensor in checkpoint_weights(model):
        weight = tensor.to("cpu").contiguous()
        if weight.data_ptr() in stored:
            weight = weight.clone()  # safetensors refuses two names on one storage
        stored.add(weight.data_ptr())
        weights[name] = weight
    save_file(weights, os.path.join(folder, "model.safetensors"))


def engine_prompts(request: GenerationRequest) -> list[list[int]]:
    """The prompts as token-id lists, their left padding removed: N of them, each sampled
    ``n = G`` times; greedy, each prompt G times in a row with ``n = 1`` (vLLM refuses a
    greedy request with ``n > 1``)."""
    prompts = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(request.prompt_ids.cpu(), request.prompt_mask.cpu(), strict=True)
    ]
    if request.do_sample:
        return prompts
    return [ids for ids in prompts for _ in range(request.group_size)]


def allowed_token_ids(vocab_size: int, suppressed_ids: tuple[int, ...]) -> list[int] | None:
    """Every id but the suppressed ones (vLLM masks the others to -inf before sampling), or
    None when nothing is suppressed.

    >>> allowed_token_ids(5, (1, 3)), allowed_token_ids(5, ())
    ([0, 2, 4], None)
    """
    if not suppressed_ids:
        return None
    banned = set(suppressed_ids)
    return [i for i in range(vocab_size) if i not in banned]


def sampling_seed() -> int:
    """A request seed from torch's global RNG: a run that seeds torch samples the same."""
    return int(torch.randint(0, 2**31 - 1, ()).item())


def assemble_generation(
    rows: list[tuple[list[int], list[float]]], request: GenerationRequest, version: int
) -> Generation:
    """The ``Generation`` of B ``(token ids, sampled-token log-probs)`` rows, in row order.

    ``completion_ids`` (B, T) with T the longest row, ``pad_id`` after each row's first stop id
    (vLLM stops on it and keeps it, as ``HFBackend`` does); ``sampler_logp`` (B, T), 0 on
    padding.
    """
    B = len(rows)
    T = max((len(ids) for ids, _ in rows), default=0)
    completion_ids = torch.full((B, T), request.pad_id, dtype=torch.long)
    sampler_logp = torch.zeros(B, T, dtype=torch.float32)
    for b, (ids, logps) in enumerate(rows):
        completion_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        sampler_logp[b, : len(logps)] = torch.tensor(logps, dtype=torch.float32)
    if request.stop_ids:
        mask = completion_mask_from_eos(completion_ids, list(request.stop_ids))  # (B, T)
        # vLLM ends a row on its first stop id, so this only pads rows shorter than T.
        completion_ids = completion_ids.masked_fill(mask == 0, request.pad_id)
        sampler_logp = sampler_logp.masked_fill(mask == 0, 0.0)
    device = request.prompt_ids.device
    return Generation(
        completion_ids=completion_ids.to(device),
        finish_reasons=finish_reasons(completion_ids, list(request.stop_ids)),
        sampler_logp=sampler_logp.to(device),
        weights_version=version,
    )


class VLLMBackend:
    """Samples with vLLM, colocated in the trainer's process or on a running server.

    Args:
        mode: ``colocate`` (an in-process ``vllm.LLM``) or ``server`` (a running vLLM
            OpenAI-compatible server).
        dtype: the engine's weights; ``auto`` = the module's parameter dtype.
        max_model_len: prompt + completion tokens the engine plans for; None: the model
            config's context length (vLLM's default). Set it for long-context checkpoints, or
            vLLM reserves KV cache for 32k-token sequences.
        gpu_memory_utilization: (colocate) share of the GPU memory vLLM may take for weights
            and KV cache; the trainer keeps the rest. 0.3 is TRL's default for colocation.
        kv_cache_memory_bytes: (colocate) the KV cache's size in bytes; None: vLLM sizes it
            (from ``gpu_memory_utilization`` on a GPU, from the free memory on CPU).
        max_num_seqs: (colocate) the most sequences one engine step runs; None: vLLM's.
        enable_sleep_mode: (colocate, GPU) offload the engine between rollouts so the
            optimizer step gets the memory back (vLLM's CPU workers ignore it).
        sleep_level: 1 offloads the weights to CPU memory and drops the KV cache; 2 drops the
            weights too (they are pushed again before the next sample).
        enable_chunked_prefill: (colocate) None: off on CPU, vLLM's default elsewhere. vLLM
            0.32's CPU worker fails seeded requests whose prefill is split into chunks
            ("CPU Generator does not use offset"); a server on CPU needs
            ``--no-enable-chunked-prefill`` for the same reason.
        enforce_eager: (colocate) no CUDA graphs / torch.compile: slower steps, faster start.
        engine_options: (colocate) further ``vllm.LLM`` keyword arguments, passed as they are.
        server_url: (server) the server's base URL; None: ``http://{server_host}:{server_port}``.
        server_host, server_port: (server) where the server listens.
        connect_timeout_s: (server) how long to wait for ``/health`` on first use.
        request_timeout_s: (server) the longest one HTTP request (a rollout, a weight push) may
            take.
        weight_sync: (server) how weights reach the server: ``nccl`` (NCCL broadcast, GPUs on
            both sides), ``disk`` (a safetensors checkpoint in ``weight_sync_dir``, which the
            server must be able to read), ``auto`` = ``nccl`` when this process has a CUDA
            device, else ``disk``.
        weight_sync_dir: (server, disk) the folder the checkpoint is written to; None: a
            temporary folder (only for a server on this host).
        nccl_address, nccl_port: (server, nccl) where this process opens the NCCL rendezvous
            (the server's workers connect to it); address None: 127.0.0.1 for a server on this
            host, else this host's address.
        seeded: send a seed with each request (drawn from torch's RNG), so seeded runs repeat.
    """

    name: ClassVar[str] = "vllm"
    samples_module: ClassVar[bool] = False

    def __init__(
        self,
        mode: str = "colocate",
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.3,
        kv_cache_memory_bytes: int | None = None,
        max_num_seqs: int | None = None,
        enable_sleep_mode: bool = False,
        sleep_level: int = 1,
        enable_chunked_prefill: bool | None = None,
        enforce_eager: bool = False,
        engine_options: Mapping[str, Any] | None = None,
        server_url: str | None = None,
        server_host: str = "127.0.0.1",
        server_port: int = 8000,
        connect_timeout_s: float = 240.0,
        request_timeout_s: float = 600.0,
        weight_sync: str = "auto",
        weight_sync_dir: str | None = None,
        nccl_address: str | None = None,
        nccl_port: int = 51216,
        seeded: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"unknown vllm rollout mode {mode!r}; valid: {list(MODES)}")
        if dtype not in DTYPES:
            raise ConfigError(f"unknown vllm dtype {dtype!r}; valid: {list(DTYPES)}")
        if weight_sync not in WEIGHT_SYNCS:
            raise ConfigError(
                f"unknown vllm weight_sync {weight_sync!r}; valid: {list(WEIGHT_SYNCS)}"
            )
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        if sleep_level not in (1, 2):
            raise ConfigError(f"sleep_level must be 1 or 2, got {sleep_level}")
        if mode == "server" and enable_sleep_mode:
            raise ConfigError(
                "enable_sleep_mode is a colocate option: a server's memory is not the trainer's"
            )
        if mode == "colocate" and server_url is not None:
            raise ConfigError("server_url is a server-mode option; set mode: server")
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(VLLM_MISSING)
        self.mode = mode
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_cache_memory_bytes = kv_cache_memory_bytes
        self.max_num_seqs = max_num_seqs
        self.enable_sleep_mode = enable_sleep_mode
        self.sleep_level = sleep_level
        self.enable_chunked_prefill = enable_chunked_prefill
        self.enforce_eager = enforce_eager
        self.engine_options = dict(engine_options or {})
        self.server_url = (server_url or f"http://{server_host}:{server_port}").rstrip("/")
        self.server_host = server_host
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.weight_sync = weight_sync
        self.weight_sync_dir = weight_sync_dir
        self.nccl_address = nccl_address
        self.nccl_port = nccl_port
        self.seeded = seeded

        self._version: int | None = None  # the weights version the engine holds
        self._llm = None  # colocate: the vllm.LLM, built on first use
        self._config_dir: tempfile.TemporaryDirectory | None = None
        self._asleep: set[str] = set()  # colocate: the engine memory a sleep released
        self._weights_dropped = False  # a level-2 sleep discarded the engine's weights
        self._session = None  # server: a requests.Session, opened on first use
        self._served_model: str | None = None
        self._sync_dir: tempfile.TemporaryDirectory | None = None
        self._transfer = None  # server, nccl: vLLM's trainer-side weight transfer engine
        self._pushes = 0  # server, disk: checkpoints written so far
        self._last_push_dir: str | None = None
        self.load_seconds: float | None = None  # colocate: how long the engine took to build
        self._last_load_s: float | None = None

    @property
    def weights_version(self) -> int | None:
        """The weights version the engine holds (None before the first load)."""
        return self._version

    # -- what it can sample from --------------------------------------------------------

    def unsupported_reason(self, module: torch.nn.Module) -> str | None:
        """Why vLLM cannot sample from ``module`` (None: it can)."""
        model = bare_module(module)
        if not isinstance(model, PreTrainedModel):
            return (
                f"{type(model).__name__} is not a transformers model; vLLM builds its engine "
                "from a Hugging Face config"
            )
        if hasattr(model, "peft_config"):
            return "a PEFT-wrapped model (merge its adapters first)"
        if getattr(model.config, "vision_config", None) is not None:
            return "a vision-language model: this backend sends token ids, not images"
        vllm = import_vllm()
        from vllm import ModelRegistry  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)

        architecture = type(model).__name__
        if architecture not in ModelRegistry.get_supported_archs():
            return f"vLLM {vllm.__version__} has no implementation of {architecture}"
        if self.mode == "colocate":
            return cpu_attention_reason(model)
        return None

    # -- the protocol -------------------------------------------------------------------

    def load_weights(self, module: torch.nn.Module, version: int) -> None:
        """Copy ``module``'s current weights into the engine and remember ``version``."""
        start = time.perf_counter()
        model = bare_module(module)
        if self.mode == "colocate":
            llm = self._colocated_engine(model)
            if "weights" in self._asleep:
                # Map the weights' memory back before writing into it (as TRL does for the same vLLM reload).
                llm.wake_up(tags=["weights"])
                self._asleep.discard("weights")
            llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": checkpoint_weights(model)}
            )
            # Cached prompt KV was computed with the old weights.
            llm.reset_prefix_cache()
        else:
            self._push_to_server(model, version)
        self._version = version
        self._weights_dropped = False
        self._last_load_s = time.perf_counter() - start
        logger.debug("vllm: weights version %d loaded in %.2f s", version, self._last_load_s)

    @torch.no_grad()
    def generate(self, module: torch.nn.Module, request: GenerationRequest) -> Generation:
        """``request.group_size`` completions per prompt, rows ``n*G .. n*G+G-1`` for prompt
        ``n``; the engine is brought to ``request.weights_version`` first if it is behind."""
        self._last_load_s = None
        if self._version != request.weights_version or self._weights_dropped:
            self.load_weights(module, request.weights_version)
        start = time.perf_counter()
        if self.mode == "colocate":
            rows, version = self._generate_colocated(bare_module(module), request)
        else:
            rows, version = self._generate_on_server(bare_module(module), request)
        generation = assemble_generation(rows, request, version)
        generation.timings["vllm/generate_s"] = time.perf_counter() - start
        if self._last_load_s is not None:
            generation.timings["vllm/load_weights_s"] = self._last_load_s
        return generation

    def close(self) -> None:
        """Shut the engine (colocate) or the weight-transfer group (server) down."""
        if self._transfer is not None:
            self._transfer.shutdown()
            self._transfer = None
        if self._llm is not None:
            llm, self._llm = self._llm, None
            shutdown = getattr(llm.llm_engine, "shutdown", None)
            if shutdown is not None:
                shutdown()
            del llm
        for folder in (self._config_dir, self._sync_dir):
            if folder is not None:
                folder.cleanup()
        self._config_dir = self._sync_dir = None
        if self._session is not None:
            self._session.close()
            self._session = None
        self._version = None

    # -- colocate -----------------------------------------------------------------------

    def _colocated_engine(self, model: torch.nn.Module):
        """The in-process ``vllm.LLM`` for ``model``'s architecture, built on first use with
        random weights (``load_weights`` overwrites them)."""
        if self._llm is not None:
            return self._llm
        # load_weights hands the worker tensors in this process; with the engine in a child
        # process they would be serialised through a socket instead.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise RuntimeError(
                "the colocated vllm backend runs the engine in this process: unset "
                "VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0"
            )
        vllm = import_vllm()
        from vllm.platforms import current_platform  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)

        config = copy.deepcopy(model.config)
        # A model built from a config (not from_pretrained) has no `architectures`, which is
        # how vLLM picks its implementation.
        config.architectures = [type(model).__name__]
        self._config_dir = tempfile.TemporaryDirectory(prefix="creditflow-vllm-")
        config.save_pretrained(self._config_dir.name)
        chunked = self.enable_chunked_prefill
        if chunked is None and current_platform.is_cpu():
            chunked = False  # see enable_chunked_prefill in the class docstring
        options = {
            "model": self._config_dir.name,
            "load_format": "dummy",
            "skip_tokenizer_init": True,
            "dtype": self._engine_dtype(model),
            "generation_config": "vllm",
            "logprobs_mode": "processed_logprobs",
            "seed": 0,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enable_sleep_mode": self.enable_sleep_mode,
            "enforce_eager": self.enforce_eager,
            "max_model_len": self.max_model_len,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "max_num_seqs": self.max_num_seqs,
            "enable_chunked_prefill": chunked,
        }
        options = {key: value for key, value in options.items() if value is not None}
        options.update(self.engine_options)
        start = time.perf_counter()
        self._llm = vllm.LLM(**options)
        self.load_seconds = time.perf_counter() - start
        logger.info(
            "vllm %s: %s engine built in %.1f s",
            vllm.__version__,
            config.architectures[0],
            self.load_seconds,
        )
        return self._llm

    def _engine_dtype(self, model: torch.nn.Module) -> str:
        if self.dtype != "auto":
            return self.dtype
        return str(next(model.parameters()).dtype).removeprefix("torch.")

    def _generate_colocated(
        self, model: torch.nn.Module, request: GenerationRequest
    ) -> tuple[list[tuple[list[int], list[float]]], int]:
        from vllm.inputs import TokensPrompt  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)

        from vllm import SamplingParams  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)

        llm = self._colocated_engine(model)
        if self._asleep:
            llm.wake_up(tags=sorted(self._asleep))
            self._asleep.clear()
        params = SamplingParams(
            **self._sampling_options(request, vocab_size(model)), detokenize=False
        )
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in engine_prompts(request)]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rows = []
        for output in outputs:  # one per prompt, in prompt order
            for sample in sorted(output.outputs, key=lambda o: o.index):
                ids = list(sample.token_ids)
                logps = [step[i].logprob for i, step in zip(ids, sample.logprobs, strict=True)]
                rows.append((ids, logps))
        if self.enable_sleep_mode:
            llm.sleep(level=self.sleep_level)
            self._asleep = {"weights", "kv_cache"}
            self._weights_dropped = self.sleep_level == 2
        assert self._version is not None
        return rows, self._version

    def _sampling_options(self, request: GenerationRequest, vocab: int) -> dict[str, Any]:
        """The sampler of ``request`` as vLLM ``SamplingParams`` fields (the completions
        endpoint takes the same names)."""
        options: dict[str, Any] = {
            "n": request.group_size if request.do_sample else 1,  # see engine_prompts
            "max_tokens": request.max_new_tokens,
            "stop_token_ids": list(request.stop_ids),
            # Only the request's stop ids end a completion, as in HFBackend.
            "ignore_eos": True,
            # logprobs=0: the sampled token's log-prob alone.
            "logprobs": 0,
        }
        if request.do_sample:
            options.update(
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k,  # 0 = off, in vLLM as in the request
            )
            if self.seeded:
                options["seed"] = sampling_seed()
        else:
            options["temperature"] = 0.0  # greedy
        allowed = allowed_token_ids(vocab, request.suppressed_ids)
        if allowed is not None:
            options["allowed_token_ids"] = allowed
        return options

    # -- server -------------------------------------------------------------------------

    def _http(self):
        """A session to a server that answers ``/health``; waits up to ``connect_timeout_s``."""
        if self._session is not None:
            return self._session
        import requests  # noqa: PLC0415 - only for a vLLM server (the vllm extra)

        session = requests.Session()
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                if session.get(f"{self.server_url}/health", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise ConnectionError(
                    f"no vLLM server answered {self.server_url}/health within "
                    f"{self.connect_timeout_s:.0f} s; start one with `VLLM_SERVER_DEV_MODE=1 "
                    "python -m vllm.entrypoints.openai.api_server --model ...` (docs/vllm.md)"
                )
            time.sleep(1.0)
        models = session.get(f"{self.server_url}/v1/models", timeout=30).json()["data"]
        self._served_model = models[0]["id"]
        self._session = session
        return session

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self._http().post(
            f"{self.server_url}{path}", json=body, timeout=self.request_timeout_s
        )
        if response.status_code == 404 and path != "/v1/completions":
            raise RuntimeError(
                f"the vLLM server has no {path} endpoint: start it with VLLM_SERVER_DEV_MODE=1 "
                "(weights and caches are dev-mode routes)"
            )
        if response.status_code != 200:
            raise RuntimeError(
                f"vLLM server {path} answered {response.status_code}: {response.text[:500]}"
            )
        return response.json() if response.content else None

    def _push_to_server(self, model: torch.nn.Module, version: int) -> None:
        sync = self.weight_sync
        if sync == "auto":
            sync = "nccl" if torch.cuda.is_available() else "disk"
        if sync == "nccl":
            self._nccl_transfer(model).send_weights()
        else:
            # A fresh folder per push: the server may still map the previous checkpoint's
            # files, and overwriting them in place hands it a mix of both (seen on CPU).
            self._pushes += 1
            folder = os.path.join(self._disk_sync_dir(), f"push-{self._pushes:06d}")
            save_checkpoint(model, folder)
            self._post(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": folder}},
            )
            if self._last_push_dir is not None:
                shutil.rmtree(self._last_push_dir, ignore_errors=True)
            self._last_push_dir = folder
        self._post("/reset_prefix_cache")
        self._post("/update_weight_version", {"new_version": str(version)})

    def _disk_sync_dir(self) -> str:
        if self.weight_sync_dir is not None:
            os.makedirs(self.weight_sync_dir, exist_ok=True)
            return self.weight_sync_dir
        if self.server_host not in LOOPBACK_HOSTS:
            raise ConfigError(
                "weight_sync: disk with a server on another host needs weight_sync_dir, a "
                "folder both machines can read"
            )
        if self._sync_dir is None:
            self._sync_dir = tempfile.TemporaryDirectory(prefix="creditflow-vllm-weights-")
        return self._sync_dir.name

    def _nccl_transfer(self, model: torch.nn.Module):
        """vLLM's trainer-side NCCL weight-transfer engine, joined on first use: this process
        is rank 0 of a group with the server's workers, and each push broadcasts every
        parameter from it."""
        if self._transfer is not None:
            return self._transfer
        import_vllm()
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)

        workers = self._http().get(f"{self.server_url}/get_world_size", timeout=30)
        workers.raise_for_status()
        address = self.nccl_address
        if address is None:
            address = (
                "127.0.0.1"
                if self.server_host in LOOPBACK_HOSTS
                else socket.gethostbyname(socket.gethostname())
            )
        init = NCCLTrainerInitInfo(
            master_address=address,
            master_port=self.nccl_port,
            world_size=workers.json()["world_size"] + 1,
            rank=0,
        )
        self._transfer = WeightTransferTrainerFactory.trainer_init(
            init,
            client=HTTPVLLMWeightSyncClient(self.server_url, timeout=self.request_timeout_s),
            source=checkpoint_source(WeightSource, ParamMeta, model),
        )
        return self._transfer

    def _server_version(self) -> int:
        """The weights version the server reports (-1 when it is not one of ours)."""
        info = self._http().get(f"{self.server_url}/weight_info", timeout=30)
        if info.status_code != 200:
            assert self._version is not None
            return self._version  # a server without dev routes: trust our own count
        try:
            return int(info.json()["weight_version"])
        except (TypeError, ValueError):
            return -1

    def _generate_on_server(
        self, model: torch.nn.Module, request: GenerationRequest
    ) -> tuple[list[tuple[list[int], list[float]]], int]:
        self._http()
        version = self._server_version()
        body = {
            "model": self._served_model,
            "prompt": engine_prompts(request),
            **self._sampling_options(request, vocab_size(model)),
            "return_token_ids": True,
            # Log-prob entries keyed "token_id:N": no detokenisation on the server.
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        choices = self._post("/v1/completions", body)["choices"]
        if len(choices) != request.num_rows:
            raise RuntimeError(
                f"the vLLM server returned {len(choices)} completions for {request.num_rows} rows"
            )
        # index = prompt * G + sample (vLLM's completion serving numbers them so).
        rows = [
            (choice["token_ids"], choice["logprobs"]["token_logprobs"])
            for choice in sorted(choices, key=lambda c: c["index"])
        ]
        return rows, version


def checkpoint_source(weight_source: type, param_meta: type, model: torch.nn.Module):
    """A vLLM ``WeightSource`` over ``checkpoint_weights(model)`` (vLLM's ``ModuleSource``
    walks ``named_parameters``, which lists a tied head once, under the embedding's name).
    vLLM's classes are passed in, so this module imports vLLM only when it is used."""

    class CheckpointSource(weight_source):
        def metadata(self):
            return [
                param_meta(name, tensor.dtype, tuple(tensor.shape))
                for name, tensor in checkpoint_weights(model)
            ]

        def __iter__(self):
            yield from checkpoint_weights(model)

    return CheckpointSource()


def vocab_size(model: torch.nn.Module) -> int:
    """V: the rows of the output head (Qwen checkpoints pad theirs past the tokenizer)."""
    return model.get_output_embeddings().weight.shape[0]


def cpu_attention_reason(model: torch.nn.Module) -> str | None:
    """On a CPU-only vLLM, the head sizes its attention kernel lacks (None: supported or not
    on CPU)."""
    from vllm.platforms import current_platform  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)

    if not current_platform.is_cpu():
        return None
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend  # noqa: PLC0415 - vLLM is an optional extra (make install-vllm)

    config = model.config.get_text_config()
    head_size = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_size not in supported:
        return f"head size {head_size}: vLLM's CPU attention supports {supported}"
    return None
