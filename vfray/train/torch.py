"""torch ``IterableDataset`` s over :mod:`vfray.train` batches: a live farm stream (the farm runs
on an event loop in a thread of its own and hands batches over a one-slot queue) or a run
folder. torch is the ``train`` extra; this module is the only one importing it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from vfray.errors import MissingExtraError
from vfray.train.batch import Batch
from vfray.train.loader import iter_batches, read_samples, stream_batches

try:
    import torch
    from torch.utils.data import IterableDataset
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError("train", "torch") from exc

if TYPE_CHECKING:
    from vfray.farm import Farm
    from vfray.task import Task

TENSORS = (
    "input_ids",
    "attention_mask",
    "loss_mask",
    "inference_logprobs",
    "advantages",
    "rewards",
    "token_level_rewards",
    "policy_version",
    "position_ids",
    "lengths",
    "cu_seqlens",
    "rollout_index",
    "truncated",
)

ALIASES = {"old_logprobs": "inference_logprobs", "response_mask": "loss_mask"}
"""Other names of the same tensors (the name before; verl's)."""


def to_tensors(batch: Batch, device: str | torch.device | None = None) -> dict[str, Any]:
    """The batch's arrays as tensors (``torch.from_numpy``: no copy on the CPU; an alias is
    the same tensor), plus its ``stats``, ``layout``, ``trace_ids``, ``group_ids`` and
    ``finish_reasons`` (numpy object arrays)."""
    out: dict[str, Any] = {
        name: torch.from_numpy(getattr(batch, name)).to(device) for name in TENSORS
    }
    out.update({alias: out[name] for alias, name in ALIASES.items()})
    out.update(
        stats=batch.stats,
        layout=batch.layout,
        trace_ids=batch.trace_ids,
        group_ids=batch.group_ids,
        finish_reasons=batch.finish_reasons,
    )
    return out


class _Done:
    """End of the stream, with its error if it failed."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class StreamDataset(IterableDataset[dict[str, Any]]):
    """Batches from ``farm.stream(tasks, rollouts_per_task)`` as dicts of tensors; use with
    ``DataLoader(dataset, batch_size=None)``. Leaving the loop (``break``) stops the stream:
    its boxes are torn down and the rows written so far kept, before the loop goes on."""

    def __init__(
        self,
        farm: Farm,
        tasks: Iterable[Task[Any]],
        rollouts_per_task: int,
        batch_size: int,
        *,
        device: str | torch.device | None = None,
        **build: Any,
    ) -> None:
        self.farm, self.tasks, self.n = farm, tasks, rollouts_per_task
        self.batch_size, self.device, self.build = batch_size, device, build

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # The stream (training mode settles the farm's sampling) and the farm's start (Ray
        # installs signal handlers) belong on the caller's thread; the stream runs on the
        # thread's loop from its first item on.
        stream = self.farm.stream(self.tasks, self.n)
        self.farm._start()
        handoff: queue.Queue[Batch | _Done] = queue.Queue(maxsize=1)
        stop = threading.Event()
        ready: queue.Queue[tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]] = queue.Queue()

        async def produce() -> None:
            try:
                async for batch in stream_batches(stream, self.batch_size, **self.build):
                    while not stop.is_set():
                        try:
                            handoff.put(batch, timeout=0.05)
                            break
                        except queue.Full:
                            await asyncio.sleep(0.05)
                    if stop.is_set():
                        break
            finally:
                await stream.aclose()

        def run() -> None:
            async def main() -> None:
                task = asyncio.ensure_future(produce())
                ready.put((asyncio.get_running_loop(), task))
                await task

            error: BaseException | None = None
            try:
                asyncio.run(main())
            except asyncio.CancelledError:
                pass
            except BaseException as exc:
                error = exc
            with contextlib.suppress(queue.Full):
                handoff.put(_Done(error), timeout=0.1 if stop.is_set() else None)

        thread = threading.Thread(target=run, name="vfray-stream", daemon=True)
        thread.start()
        loop, task = ready.get()
        try:
            while True:
                item = handoff.get()
                if isinstance(item, _Done):
                    if item.error is not None:
                        raise item.error
                    return
                yield to_tensors(item, self.device)
        finally:
            stop.set()
            if thread.is_alive():
                with contextlib.suppress(RuntimeError):  # the loop already closed
                    loop.call_soon_threadsafe(task.cancel)
                with contextlib.suppress(queue.Empty):
                    handoff.get_nowait()  # unblock a waiting put
                thread.join()


class RunDataset(IterableDataset[dict[str, Any]]):
    """Batches of a finished run folder's samples, as dicts of tensors (offline training)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        batch_size: int,
        *,
        shuffle_seed: int | None = None,
        device: str | torch.device | None = None,
        **build: Any,
    ) -> None:
        self.samples = read_samples(run_dir)
        self.batch_size, self.seed, self.device, self.build = (
            batch_size,
            shuffle_seed,
            device,
            build,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in iter_batches(
            self.samples, self.batch_size, shuffle_seed=self.seed, **self.build
        ):
            yield to_tensors(batch, self.device)
