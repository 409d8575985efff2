"""Data-parallel launch: run a training function in N processes, one ``Accelerator`` each.

A Kedro node runs in one process. :func:`run_data_parallel` lets a node fan out: it starts
``num_processes`` workers with ``torch.multiprocessing`` ("spawn"), each joins one process
group through ``accelerate.Accelerator`` (gloo on CPU, nccl on CUDA, one GPU per process) and
runs ``fn(accelerator, *args)``; the node gets rank 0's return value. ``GRPOTrainer(...,
accelerator=accelerator)`` then trains data-parallel (see ``training.grpo``).

When this process was itself started by a launcher (``torchrun``, ``accelerate launch
--multi_gpu``: a ``WORLD_SIZE`` above 1 in the environment), nothing is spawned: ``fn`` runs
here with an ``Accelerator`` that joins the launcher's group. That is how several machines
train one model (docs/scale_out.md).
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from creditflow.errors import DataParallelError

if TYPE_CHECKING:
    from accelerate import Accelerator

logger = logging.getLogger(__name__)

# accelerate_config keys that hold the settings of a plugin object rather than an Accelerator
# argument: plain mappings travel to every worker (and from YAML); each builds its own plugin.
PLUGIN_KEYS = {"fsdp": "fsdp_plugin"}
_RESULT_FILE = "rank0_result.pt"
_CALL_FILE = "call.pt"
_ERROR_PREFIX = "error-rank"


def accelerator_arguments() -> tuple[str, ...]:
    """The keys ``accelerate_config`` accepts: ``Accelerator``'s arguments, with the keys of
    :data:`PLUGIN_KEYS` in place of the plugin objects they build."""
    from accelerate import Accelerator  # noqa: PLC0415 - accelerate is imported by launches only

    names = [name for name in inspect.signature(Accelerator.__init__).parameters if name != "self"]
    return tuple(sorted({*names, *PLUGIN_KEYS} - set(PLUGIN_KEYS.values())))


def make_accelerator(accelerate_config: Mapping[str, Any] | None = None) -> Accelerator:
    """An ``Accelerator`` for this process, from a plain (YAML-able) mapping.

    ``{"fsdp": {...}}`` becomes ``fsdp_plugin=FullyShardedDataParallelPlugin(**{...})`` (it
    must say ``fsdp_version: 2``); every other key is passed as it is (``mixed_precision:
    bf16``...). ``cpu`` defaults to True when no CUDA device is visible: accelerate forms a
    gloo group of CPU processes only when asked.
    """
    from accelerate import Accelerator, FullyShardedDataParallelPlugin  # noqa: PLC0415 - accelerate is imported by launches only

    kwargs = dict(accelerate_config or {})
    _check_keys(kwargs)
    plugin = None
    if "fsdp" in kwargs:
        plugin = FullyShardedDataParallelPlugin(**kwargs.pop("fsdp"))
        if plugin.fsdp_version != 2:
            raise ValueError(
                f"fsdp.fsdp_version must be 2 (FSDP2, torch's fully_shard), got "
                f"{plugin.fsdp_version}: GRPOTrainer generates with the sharded module itself "
                f"(FSDP2's forward gathers each group's parameters), which FSDP1's wrapper "
                f"does not allow; set fsdp_version: 2"
            )
        kwargs["fsdp_plugin"] = plugin
    kwargs.setdefault("cpu", not torch.cuda.is_available())
    accelerator = Accelerator(**kwargs)
    if plugin is not None and accelerator.num_processes > 1 and not accelerator.is_fsdp2:
        _use_fsdp_on_cpu(accelerator, plugin)
    return accelerator


def _use_fsdp_on_cpu(accelerator: Accelerator, plugin: Any) -> None:
    """Make a gloo group of CPU processes shard with FSDP2, as a GPU group would.

    accelerate 1.15 keeps the FSDP plugin only for accelerator devices: with ``cpu`` it drops
    it and wraps the model in DDP instead, silently. torch's ``fully_shard`` itself runs on
    CPU tensors over gloo, so the state is switched to FSDP by hand; ``prepare`` then takes
    the same FSDP2 path as on GPUs (tests/training/test_fsdp.py).
    """
    from accelerate.state import PartialState  # noqa: PLC0415 - accelerate is imported by launches only
    from accelerate.utils import DistributedType  # noqa: PLC0415 - accelerate is imported by launches only

    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        raise ValueError(
            f"accelerate did not enable FSDP for distributed type "
            f"{accelerator.distributed_type}; FSDP runs on CUDA or on CPU (gloo) processes"
        )
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    # What AcceleratorState.__init__ does for GPUs: a later PartialState() (accelerate's
    # gather, reduce, ...) reads the type from there.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def launcher_world_size() -> int:
    """The number of processes an outside launcher started (``WORLD_SIZE``); 1 when none did."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def run_data_parallel(
    fn: Callable[..., Any],
    num_processes: int,
    *,
    args: Sequence[Any] = (),
    accelerate_config: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
) -> Any:
    """``fn(accelerator, *args)`` in ``num_processes`` data-parallel processes; rank 0's result.

    With spawned workers the result travels back through ``torch.save``/``torch.load`` and
    its tensors arrive on the CPU.

    Args:
        fn: a module-level function (workers import it by name), taking the process's
            ``Accelerator`` (None when ``num_processes`` is 1 and there is no
            ``accelerate_config``) and ``args``. Every process must make the same collective
            calls (``GRPOTrainer`` does); only rank 0's return value is kept, so return
            unwrapped modules (``accelerator.unwrap_model(m, keep_fp32_wrapper=False)``).
        num_processes: processes in the group (on CUDA: one GPU each, at most the visible
            count). 1 runs ``fn`` in this process, with no process group at all.
        args: passed to ``fn``. With 1 process they are the caller's objects; otherwise every
            worker loads its own copy (``torch.save``/``torch.load`` through a temporary
            file, never shared memory), so the caller's objects are never modified.
        accelerate_config: ``Accelerator`` arguments (``mixed_precision``, ``cpu``, ...) and
            ``fsdp``: a mapping of ``FullyShardedDataParallelPlugin`` arguments, with
            ``fsdp_version: 2`` (FSDP2 sharding, also on CPU processes: see
            ``make_accelerator``). Unknown keys raise ValueError. ``cpu`` defaults to True
            without CUDA (gloo) and False with it.
        timeout_s: kill the workers and raise TimeoutError after this long; None waits.

    Under a launcher (``WORLD_SIZE`` > 1 in the environment, e.g. ``torchrun``)
    nothing is spawned: ``fn`` runs in this process, ``num_processes`` must equal the
    launcher's ``WORLD_SIZE``, and each process gets its own return value (data parallelism
    keeps the weights equal on every rank).

    Workers use one intra-op thread unless ``OMP_NUM_THREADS`` says otherwise (torchrun's
    rule): N processes each spreading over every core would oversubscribe the CPU.

    Raises:
        ValueError: bad ``num_processes``, unknown ``accelerate_config`` keys, more processes
            than GPUs, a ``fn`` or ``args`` that cannot be pickled, or a mismatch with the
            launcher's ``WORLD_SIZE``.
        DataParallelError: a worker raised; the message holds the traceback of the first
            worker that failed (a peer then usually fails on the lost connection), and the
            other workers are terminated.
    """
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an integer >= 1, got {num_processes!r}")
    config = dict(accelerate_config or {})
    _check_keys(config)
    launched = launcher_world_size()
    if launched > 1:
        if num_processes != launched:
            raise ValueError(
                f"this process was launched as one of WORLD_SIZE={launched} processes but "
                f"num_processes={num_processes}; set num_processes to {launched} or launch "
                f"{num_processes} processes"
            )
        logger.info("joining the launcher's group of %d processes", launched)
        return fn(make_accelerator(config), *args)
    if num_processes == 1:
        # No process group: GRPOTrainer without an accelerator is the plain loop (a
        # one-process accelerator gives bit-identical results, tests/training/test_distributed).
        return fn(make_accelerator(config) if config else None, *args)
    _check_devices(num_processes, config)
    return _spawn(fn, num_processes, tuple(args), config, timeout_s)


def _check_keys(config: Mapping[str, Any]) -> None:
    valid = accelerator_arguments()
    unknown = sorted(set(config) - set(valid))
    if unknown:
        raise ValueError(f"unknown accelerate_config key(s) {unknown}; valid keys: {list(valid)}")


def _check_devices(num_processes: int, config: Mapping[str, Any]) -> None:
    uses_cuda = torch.cuda.is_available() and not config.get("cpu", False)
    if uses_cuda and num_processes > torch.cuda.device_count():
        raise ValueError(
            f"num_processes={num_processes} but only {torch.cuda.device_count()} CUDA "
            f"device(s) are visible (one per process); lower num_processes or set cpu: true"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(
    fn: Callable[..., Any],
    num_processes: int,
    args: tuple[Any, ...],
    config: dict[str, Any],
    timeout_s: float | None,
) -> Any:
    import torch.multiprocessing as mp  # noqa: PLC0415 - the spawn launcher only

    with tempfile.TemporaryDirectory(prefix="creditflow-ddp-") as workdir:
        call_file = Path(workdir) / _CALL_FILE
        # A file, not spawn's own pickling: torch.multiprocessing would hand the workers the
        # caller's tensors through shared memory, and every rank's optimizer would then update
        # the same storage in place.
        try:
            torch.save((fn, args), call_file)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise ValueError(
                f"fn and args must be picklable (fn a module-level function) to reach the "
                f"worker processes: {err}"
            ) from err
        port = _free_port()
        logger.info("starting %d data-parallel processes (port %d)", num_processes, port)
        context = mp.spawn(
            _worker,
            args=(num_processes, port, workdir, config),
            nprocs=num_processes,
            join=False,
        )
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1):
                if deadline is not None and time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    raise TimeoutError(f"{num_processes} processes did not finish in {timeout_s} s")
        except mp.ProcessRaisedException as err:
            raise DataParallelError(_first_failure(Path(workdir), num_processes)) from err
        # Onto the CPU: the worker's device is gone, and the caller (a Kedro node) may not
        # want GPU memory held in its own process.
        return torch.load(Path(workdir) / _RESULT_FILE, weights_only=False, map_location="cpu")


def _worker(rank: int, world_size: int, port: int, workdir: str, config: dict[str, Any]) -> None:
    """One spawned process: join the group as ``rank``, run fn, rank 0 saves the result."""
    # The variables torchrun and accelerate launch set; Accelerator reads them.
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    try:
        fn, args = torch.load(Path(workdir) / _CALL_FILE, weights_only=False)
        accelerator = make_accelerator(config)
        result = fn(accelerator, *args)
        if accelerator.is_main_process:
            torch.save(result, Path(workdir) / _RESULT_FILE)
        accelerator.wait_for_everyone()
    except BaseException:
        # Written before this process leaves the group, so before any peer can fail on the
        # closed connection: the earliest file is the cause (see _first_failure).
        error_file = Path(workdir) / f"{_ERROR_PREFIX}{rank}"
        error_file.write_text(f"{time.time()!r}\n{traceback.format_exc()}", encoding="utf-8")
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _first_failure(workdir: Path, world_size: int) -> str:
    """The traceback of the worker that failed first, by the time each one recorded."""
    failures = []
    for path in workdir.glob(f"{_ERROR_PREFIX}*"):
        stamp, _, text = path.read_text(encoding="utf-8").partition("\n")
        failures.append((float(stamp), int(path.name.removeprefix(_ERROR_PREFIX)), text))
    if not failures:  # killed before it could write (e.g. out of memory)
        return f"a worker of {world_size} processes died without a Python traceback"
    _, rank, text = min(failures)
    return f"rank {rank} of {world_size} failed first:\n{text}"
