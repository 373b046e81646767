"""Scoring: decorators, discovery, concurrency, failures, overrides, group rewards, episodes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vfray._plugins import load_object
from vfray.episode import Episode, finalize_episode, score_group
from vfray.errors import ConfigError
from vfray.scoring import (
    HookKind,
    check_stop,
    group_reward,
    metric,
    reward,
    score_rollout,
    scoring_hooks,
    stop,
    validate_group_config,
)
from vfray.task import Task, TaskData
from vfray.trace import Message, RewardRecord, Trace

REPO = Path(__file__).resolve().parents[1]


class QA(TaskData):
    answer: str


def make_trace(task: Task[Any], reply: str | None = "42", index: int = 0) -> Trace:
    trace = Trace(task=task.record(), rollout_index=index)
    if reply is not None:
        trace.record_call(task.data.prompt_messages, Message(role="assistant", content=reply))
    return trace


class Basic(Task[QA]):
    @reward
    def exact(self, trace: Trace) -> bool:
        return (trace.last_reply or "").strip() == self.data.answer

    @reward(weight=0.5)
    async def nonempty(self, trace: Trace) -> float:
        await asyncio.sleep(0)
        return 1.0 if trace.last_reply else 0.0

    @metric
    def length(self, trace: Trace) -> int:
        return len(trace.last_reply or "")


def qa(answer: str = "42") -> QA:
    return QA(prompt="What is 6 * 7?", answer=answer)


# -- decorators and discovery --------------------------------------------------------------


def test_decorators_bare_and_called() -> None:
    hooks = {h.name: h for h in scoring_hooks(Basic)}
    assert list(hooks) == ["exact", "nonempty", "length"]
    assert hooks["exact"].spec.kind is HookKind.REWARD and hooks["exact"].spec.weight == 1.0
    assert hooks["nonempty"].spec.weight == 0.5
    assert hooks["length"].spec.kind is HookKind.METRIC
    assert hooks["exact"].params == ("trace",)
    with pytest.raises(TypeError, match=r"weight=0\.5"):
        reward(0.5)  # type: ignore[call-overload]


async def test_score_rollout_sync_and_async_hooks() -> None:
    task = Basic(qa())
    trace = make_trace(task, "42")
    await score_rollout(task, trace)
    assert trace.rewards == {
        "exact": RewardRecord(value=1.0, weight=1.0),
        "nonempty": RewardRecord(value=1.0, weight=0.5),
    }
    assert trace.metrics == {"length": 2.0}
    assert trace.reward == 1.5
    assert trace.notes == []


def test_unknown_parameter_is_a_config_error_at_discovery() -> None:
    class Bad(Task[QA]):
        @reward
        def judge(self, trace: Trace, completion: str) -> float:
            return 0.0

    with pytest.raises(ConfigError, match="'completion'") as info:
        scoring_hooks(Bad)
    assert "Bad.judge" in str(info.value)

    class StopWithRuntime(Task[QA]):
        @stop
        def done(self, runtime: Any) -> bool:
            return True

    with pytest.raises(ConfigError, match="'runtime'"):
        scoring_hooks(StopWithRuntime)

    class DefaultedExtra(Task[QA]):
        @reward
        def ok(self, trace: Trace, scale: float = 2.0) -> float:
            return scale

    assert scoring_hooks(DefaultedExtra)[0].params == ("trace",)


def test_duplicate_reward_keys_are_a_config_error() -> None:
    class Clash(Task[QA]):
        @reward(keys=("a", "b"))
        def first(self) -> dict[str, float]:
            return {"a": 1.0, "b": 1.0}

        @reward
        def b(self) -> float:
            return 1.0

    with pytest.raises(ConfigError, match="'b'"):
        scoring_hooks(Clash)


async def test_inheritance_override_and_removal() -> None:
    class Child(Basic):
        def exact(self, trace: Trace) -> bool:  # undecorated override keeps the hook
            return True

        length = None  # type: ignore[assignment]

        @staticmethod
        @metric
        def turns(trace: Trace) -> int:
            return trace.num_turns

    names = [h.name for h in scoring_hooks(Child)]
    assert names == ["exact", "nonempty", "turns"]
    task = Child(qa())
    trace = make_trace(task, "wrong")
    await score_rollout(task, trace)
    assert trace.rewards["exact"].value == 1.0
    assert trace.metrics == {"turns": 1.0}


# -- concurrency and priority ----------------------------------------------------------------


class Rendezvous(Task[QA]):
    """Each hook waits for the other: only concurrent execution lets both finish."""

    def __init__(self, data: QA) -> None:
        super().__init__(data)
        self.a_started = asyncio.Event()
        self.b_started = asyncio.Event()
        self.barrier = threading.Barrier(2, timeout=10)

    @reward
    async def a(self) -> float:
        self.a_started.set()
        await asyncio.wait_for(self.b_started.wait(), 10)
        return 1.0

    @reward
    async def b(self) -> float:
        self.b_started.set()
        await asyncio.wait_for(self.a_started.wait(), 10)
        return 1.0

    @metric
    def sync_one(self) -> float:
        self.barrier.wait()  # sync hooks run in threads, so both reach the barrier
        return 1.0

    @metric
    def sync_two(self) -> float:
        self.barrier.wait()
        return 2.0


async def test_hooks_in_a_level_run_concurrently() -> None:
    task = Rendezvous(qa())
    trace = make_trace(task)
    await score_rollout(task, trace)
    assert trace.rewards["a"].value == 1.0 and trace.rewards["b"].value == 1.0
    assert trace.metrics == {"sync_one": 1.0, "sync_two": 2.0}


async def test_priority_levels_run_high_first_and_in_order() -> None:
    log: list[str] = []

    class Ordered(Task[QA]):
        @reward(priority=0)
        async def low(self) -> float:
            log.append("low")
            return 0.0

        @reward(priority=10)
        async def high(self) -> float:
            for _ in range(5):
                await asyncio.sleep(0)
            log.append("high")
            return 1.0

        @metric(priority=5)
        async def middle(self) -> float:
            log.append("middle")
            return 0.5

    await score_rollout(Ordered(qa()), make_trace(Ordered(qa())))
    assert log == ["high", "middle", "low"]


# -- failures, mappings, offline ---------------------------------------------------------------


async def test_failed_hooks_leave_keys_with_none_and_the_error() -> None:
    class Flaky(Task[QA]):
        @reward
        def broken(self, trace: Trace) -> float:
            return 1 / 0

        @reward(weight=2.0)
        def fine(self) -> float:
            return 0.25

        @reward
        def wrong_type(self) -> str:
            return "yes"

        @reward
        def not_finite(self) -> float:
            return float("nan")

        @metric
        async def broken_metric(self) -> float:
            raise RuntimeError("judge unreachable")

    task = Flaky(qa())
    trace = make_trace(task)
    await score_rollout(task, trace)
    assert trace.rewards["broken"].value is None
    assert trace.rewards["broken"].error == "ZeroDivisionError: division by zero"
    assert trace.rewards["wrong_type"].value is None
    assert "str" in (trace.rewards["wrong_type"].error or "")
    assert trace.rewards["not_finite"].value is None
    assert trace.rewards["fine"].value == 0.25
    assert trace.reward == 0.5  # only scored rewards count
    assert trace.metrics == {"broken_metric": None}
    assert any("judge unreachable" in note for note in trace.notes)
    # The reward hook that raised is an error on the trace, so the rollout is not ok; a metric
    # that raised, or a value that is merely unscorable (a string, NaN), is a note: no reward
    # is missing because code broke.
    assert [(e.type, e.phase, e.message) for e in trace.errors] == [
        ("TaskError", "scoring", "reward broken raised: ZeroDivisionError: division by zero"),
    ]
    assert not trace.ok


async def test_mapping_returns_and_declared_keys() -> None:
    class Multi(Task[QA]):
        @reward(weight=2.0)
        def parts(self) -> dict[str, float]:
            return {"format": 1.0, "style": 0.5}

        @reward(keys=("judge_a", "judge_b"))
        async def judges(self) -> dict[str, float]:
            raise TimeoutError("judge timed out")

        @metric(keys=("p50", "p99"))
        def latency(self) -> dict[str, float]:
            return {"p50": 1.0}

        @metric
        def empty(self) -> dict[str, float]:
            return {}

    task = Multi(qa())
    trace = make_trace(task)
    await score_rollout(task, trace)
    assert trace.rewards["format"] == RewardRecord(value=1.0, weight=2.0)
    assert trace.rewards["style"] == RewardRecord(value=0.5, weight=2.0)
    for key in ("judge_a", "judge_b"):
        assert trace.rewards[key].value is None
        assert trace.rewards[key].error == "TimeoutError: judge timed out"
    assert trace.metrics["p50"] == 1.0
    assert trace.metrics["p99"] is None
    assert trace.metrics["empty"] is None
    assert trace.reward == 3.0


class NeedsBox(Task[QA]):
    @reward
    async def tests_pass(self, trace: Trace, runtime: Any) -> float:
        return 1.0 if runtime is not None else 0.0

    @metric
    def files(self, runtime: Any) -> int:
        return 3

    @reward
    def offline_ok(self, trace: Trace) -> float:
        return 0.5


async def test_runtime_hooks_are_skipped_offline_and_reported() -> None:
    task = NeedsBox(qa())
    trace = make_trace(task)
    await score_rollout(task, trace, runtime=None)
    assert trace.rewards["tests_pass"].value is None
    assert "skipped" in (trace.rewards["tests_pass"].error or "")
    assert trace.metrics["files"] is None
    assert trace.rewards["offline_ok"].value == 0.5
    assert sum("skipped" in n for n in trace.notes) == 2


async def test_offline_rescoring_keeps_values_scored_with_a_runtime() -> None:
    task = NeedsBox(qa())
    trace = make_trace(task)
    box = object()  # stands in for a live runtime; the hooks only need a value to inject
    await score_rollout(task, trace, runtime=box)
    assert trace.rewards["tests_pass"].value == 1.0 and trace.metrics["files"] == 3.0
    await score_rollout(task, trace, runtime=None)
    assert trace.rewards["tests_pass"].value == 1.0
    assert trace.metrics["files"] == 3.0
    assert any("kept the recorded value" in n for n in trace.notes)


# -- overrides and plugins --------------------------------------------------------------------


async def test_override_by_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_scoring_pkg.py").write_text(
        "def lenient(trace, task):\n    return task.data.answer in (trace.last_reply or '')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    task = Basic(qa())
    trace = make_trace(task, "The answer is 42.")
    await score_rollout(task, trace, overrides={"exact": "my_scoring_pkg:lenient"})
    assert trace.rewards["exact"] == RewardRecord(value=1.0, weight=1.0)
    plain = make_trace(task, "The answer is 42.")
    await score_rollout(task, plain)
    assert plain.rewards["exact"].value == 0.0


async def test_override_by_file_path_adds_rewards_and_metrics(tmp_path: Path) -> None:
    plugin = tmp_path / "extra_scores.py"
    plugin.write_text(
        "from vfray.scoring import metric\n"
        "def polite(trace):\n"
        "    return 'please' in (trace.last_reply or '')\n"
        "@metric\n"
        "async def words(trace):\n"
        "    return len((trace.last_reply or '').split())\n"
    )
    task = Basic(qa())
    trace = make_trace(task, "42 please")
    overrides: dict[str, str | Callable[..., Any]] = {
        "polite": f"{plugin}:polite",
        "words": f"{plugin}:words",
        "length": len,
    }
    with pytest.raises(ConfigError, match="'obj'"):
        scoring_hooks(Basic, overrides)  # len(obj) has no injectable parameter
    overrides.pop("length")
    await score_rollout(task, trace, overrides=overrides)
    assert trace.rewards["polite"] == RewardRecord(value=1.0, weight=1.0)
    assert trace.metrics["words"] == 2.0
    assert trace.rewards["exact"].value == 0.0


async def test_override_with_a_callable_keeps_the_hook_spec() -> None:
    task = Basic(qa())
    trace = make_trace(task, "")
    await score_rollout(task, trace, overrides={"nonempty": lambda: 0.75})
    assert trace.rewards["nonempty"] == RewardRecord(value=0.75, weight=0.5)


def test_load_object_errors_are_config_errors(tmp_path: Path) -> None:
    assert load_object("os.path:join") is __import__("os").path.join
    assert load_object("vfray.scoring:HookKind.REWARD") is HookKind.REWARD
    with pytest.raises(ConfigError, match="bad import spec"):
        load_object("no_colon_here")
    with pytest.raises(ConfigError, match="bad import spec"):
        load_object("pkg.mod:not-an-identifier")
    with pytest.raises(ConfigError, match="cannot import module 'vfray_no_such_mod'"):
        load_object("vfray_no_such_mod:fn")
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        load_object("os.path:nope")
    with pytest.raises(ConfigError, match="does not exist"):
        load_object(f"{tmp_path}/missing.py:fn")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('bad plugin')\n")
    with pytest.raises(ConfigError, match="bad plugin"):
        load_object(f"{broken}:fn")
    with pytest.raises(ConfigError, match="not callable"):
        scoring_hooks(Basic, {"exact": "os:sep"})


def test_file_plugins_get_unique_module_names(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "scores.py").write_text(f"NAME = {sub!r}\n")
    assert load_object(f"{tmp_path}/a/scores.py:NAME") == "a"
    assert load_object(f"{tmp_path}/b/scores.py:NAME") == "b"
    assert load_object("b/scores.py:NAME", base_dir=tmp_path) == "b"


# -- stop hooks ---------------------------------------------------------------------------------


async def test_check_stop() -> None:
    class Stoppy(Task[QA]):
        @stop
        def answered(self, trace: Trace) -> bool:
            return self.data.answer in (trace.last_reply or "")

        @stop(priority=1)
        async def broken(self) -> bool:
            raise ValueError("oops")

    task = Stoppy(qa())
    trace = make_trace(task, "thinking")
    assert await check_stop(task, trace) is None
    assert await check_stop(task, trace) is None
    assert trace.notes == ["stop hook 'broken' failed: ValueError: oops"]  # noted once
    assert await check_stop(task, make_trace(task, "it is 42")) == "answered"
    assert await check_stop(Basic(qa()), trace) is None


# -- group rewards and episodes -----------------------------------------------------------------


class Grouped(Basic):
    @group_reward(weight=0.5)
    def rank(self, traces: list[Trace]) -> list[float]:
        return [float(i) for i in range(len(traces))]

    @group_reward(weight=0.0)
    async def bad_length(self, traces: list[Trace]) -> list[float]:
        return [1.0]

    @group_reward(keys=("g1", "g2"))
    def several(self, traces: list[Trace], task: Task[Any]) -> dict[str, list[Any]]:
        return {"g1": [True] * len(traces), "g2": ["x"] * len(traces)}


async def test_score_group_writes_one_value_per_trace() -> None:
    task = Grouped(qa())
    traces = [make_trace(task, "42", i) for i in range(3)]
    out = await score_group(task, traces)
    assert out["rank"] == [0.0, 1.0, 2.0]
    assert out["bad_length"] == [None, None, None]
    assert out["g1"] == [1.0, 1.0, 1.0]
    assert out["g2"] == [None, None, None]
    assert traces[2].rewards["rank"] == RewardRecord(value=2.0, weight=0.5, group=True)
    assert traces[0].rewards["bad_length"].error == "returned 1 values for 3 traces"
    assert "TypeError" in (traces[0].rewards["g2"].error or "")


async def test_group_rewards_need_two_rollouts() -> None:
    validate_group_config(Grouped, 2)
    validate_group_config(Basic, 1)  # no group rewards: n=1 is fine
    with pytest.raises(ConfigError, match="rank"):
        validate_group_config(Grouped, 1)
    with pytest.raises(ConfigError):
        await score_group(Grouped(qa()), [make_trace(Grouped(qa()))])
    assert await score_group(Basic(qa()), [make_trace(Basic(qa()))]) == {}


async def test_finalize_episode_stamps_ids_and_advantages() -> None:
    task = Grouped(qa())
    traces = [make_trace(task, reply, i) for i, reply in enumerate(["42", "41", "42", "x"])]
    for trace in traces:
        await score_rollout(task, trace)
    episode = await finalize_episode(task, traces)
    assert episode.task.key == task.key
    assert all(t.episode_id == episode.episode_id for t in traces)
    # exact + 0.5*nonempty + 0.5*rank + g1 (g2/bad_length have no value)
    assert episode.rewards == [2.5, 2.0, 3.5, 3.0]
    assert episode.mean_reward == 2.75
    assert episode.advantages == [-0.25, -0.75, 0.75, 0.25]
    assert [t.advantage for t in traces] == episode.advantages
    assert episode.group_rewards["rank"] == [0.0, 1.0, 2.0, 3.0]
    again = Episode.model_validate_json(episode.model_dump_json())
    assert again.rewards == episode.rewards
    # A re-finalized group keeps the id its traces share (resume).
    assert (await finalize_episode(task, traces)).episode_id == episode.episode_id


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    record = Basic(qa()).record()

    def episode(rewards: list[float | None]) -> Episode:
        traces = []
        for value in rewards:
            trace = Trace(task=record)
            if value is not None:
                trace.rewards["r"] = RewardRecord(value=value)
            traces.append(trace)
        return Episode(task=record, traces=traces)

    ep = episode([1.0, 0.0, 0.0, 1.0, None])
    assert ep.pass_at_k(1) == pytest.approx(2 / 5)
    assert ep.pass_at_k(2) == pytest.approx(1 - 3 / 10)
    assert ep.pass_at_k(4) == 1.0
    assert ep.pass_at_k(1, threshold=0.0) == pytest.approx(4 / 5)
    assert ep.mean_reward == 0.5
    assert ep.advantages == [0.5, -0.5, -0.5, 0.5, None]
    with pytest.raises(ValueError):
        ep.pass_at_k(6)
    assert episode([None, None]).mean_reward is None


async def test_example_arithmetic_scoring() -> None:
    make = load_object(f"{REPO}/vfray/tasksets/arithmetic.py:make_task")
    task = make(12, 30)
    assert task.data.prompt == "What is 12 + 30?"
    replies = ["12 + 30 = 42", "42", "The answer is 41", "I think 42 because 40 + 2 = 42"]
    traces = [make_trace(task, reply, i) for i, reply in enumerate(replies)]
    for trace in traces:
        await score_rollout(task, trace)
    assert [t.rewards["correct"].value for t in traces] == [1.0, 1.0, 0.0, 1.0]
    assert traces[1].metrics["reply_chars"] == 2.0
    episode = await finalize_episode(task, traces)
    assert episode.group_rewards["brevity_rank"] == [0.5, 1.0, 0.0, 0.0]
    assert episode.pass_at_k(1) == 0.75


async def test_static_and_class_method_hooks() -> None:
    class Methods(Task[QA]):
        @reward(weight=2.0)
        @staticmethod
        def static_first(trace: Trace) -> float:
            return 0.5

        @classmethod
        @metric
        def from_class(cls, task: Task[Any]) -> float:
            return 1.0 if isinstance(task, cls) else 0.0

    assert [h.params for h in scoring_hooks(Methods)] == [("trace",), ("task",)]
    task = Methods(qa())
    trace = make_trace(task)
    await score_rollout(task, trace)
    assert trace.rewards["static_first"] == RewardRecord(value=0.5, weight=2.0)
    assert trace.metrics == {"from_class": 1.0}


# -- values that are not scores ------------------------------------------------------------


class Unscorable:
    """A value whose ``__float__`` raises: the hook's fault, recorded on its key."""

    def __float__(self) -> float:
        raise RuntimeError("no float for you")


class OddValues(Task[QA]):
    @reward
    def huge(self) -> int:
        return 10**400

    @reward
    def infinite(self) -> float:
        return float("-inf")

    @reward
    def nan(self) -> float:
        return float("nan")

    @reward
    def text(self) -> str:
        return "1.0"

    @reward
    def unscorable(self) -> Any:
        return Unscorable()

    @reward
    def fine(self) -> float:
        return 0.5

    @metric
    def huge_metric(self) -> int:
        return -(10**400)

    @group_reward
    def huge_group(self, traces: list[Trace]) -> list[Any]:
        return [10**400, 1.0, float("nan")][: len(traces)]


async def test_unscorable_values_leave_their_key_empty_with_the_error() -> None:
    task = OddValues(qa())
    traces = [make_trace(task, index=i) for i in range(3)]
    for trace in traces:
        await score_rollout(task, trace)  # must not raise
    trace = traces[0]
    for key, error in [
        ("huge", "OverflowError"),
        ("infinite", "non-finite"),
        ("nan", "non-finite"),
        ("text", "TypeError"),
        ("unscorable", "no float for you"),
    ]:
        assert trace.rewards[key].value is None, key
        assert error in (trace.rewards[key].error or ""), (key, trace.rewards[key].error)
    assert trace.metrics["huge_metric"] is None
    assert any("huge_metric" in note and "OverflowError" in note for note in trace.notes)
    assert trace.rewards["fine"].value == 0.5
    assert trace.reward == 0.5
    episode = await finalize_episode(task, traces)  # must not raise
    assert episode.group_rewards["huge_group"] == [None, 1.0, None]
    assert "OverflowError" in (traces[0].rewards["huge_group"].error or "")
    assert "non-finite" in (traces[2].rewards["huge_group"].error or "")
    assert episode.rewards == [0.5, 1.5, 0.5]


async def test_a_reward_sum_past_float_range_is_no_reward_not_infinity() -> None:
    class Big(Task[QA]):
        @reward(weight=10.0)
        def big(self) -> float:
            return 1e308

    task = Big(qa())
    trace = make_trace(task)
    await score_rollout(task, trace)
    assert trace.rewards["big"].value == 1e308
    assert trace.reward is None
    assert any("not a finite number" in note for note in trace.notes)


# -- deadlines and the hook threads ----------------------------------------------------------


class Stuck(Task[QA]):
    """One sync and one async hook that do not return until released; one that does."""

    release = threading.Event()

    @reward
    def blocks(self) -> float:
        self.release.wait(60)
        return 1.0

    @metric
    async def awaits(self) -> float:
        await asyncio.sleep(60)
        return 1.0

    @reward(weight=2.0)
    def quick(self) -> float:
        return 0.5

    @group_reward
    def group_blocks(self, traces: list[Trace]) -> list[float]:
        self.release.wait(60)
        return [1.0] * len(traces)


async def test_hooks_past_the_deadline_leave_their_keys_empty_and_the_rest_stands() -> None:
    task = Stuck(qa())
    trace = make_trace(task)
    try:
        await score_rollout(task, trace, timeout=0.5)
        assert trace.rewards["blocks"].value is None
        assert "PhaseTimeoutError" in (trace.rewards["blocks"].error or "")
        assert trace.metrics["awaits"] is None
        assert trace.rewards["quick"].value == 0.5
        assert trace.reward == 1.0
        error = trace.error()
        assert error is not None and error.type == "PhaseTimeoutError"
        assert "blocks" in error.message and "awaits" in error.message
        traces = [make_trace(task, index=i) for i in range(2)]
        episode = await finalize_episode(task, traces, timeout=0.5)
        assert episode.group_rewards["group_blocks"] == [None, None]
        assert "PhaseTimeoutError" in (traces[0].rewards["group_blocks"].error or "")
    finally:
        Stuck.release.set()


async def test_sync_hooks_do_not_use_the_loops_default_thread_pool() -> None:
    """File writes and sweeps share the default pool; hooks that block must not starve it
    (and asyncio.run joins it at exit, so a hook that never returns would hang the process)."""
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(1)
    loop.set_default_executor(pool)
    held = threading.Event()
    pool.submit(held.wait, 30)  # the default pool's only worker is busy
    try:
        task = Basic(qa())
        trace = make_trace(task)
        await asyncio.wait_for(score_rollout(task, trace, timeout=10), 15)
        assert trace.rewards["exact"].value == 1.0 and trace.ok
    finally:
        held.set()
