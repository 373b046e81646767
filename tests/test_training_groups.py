"""Training semantics of a group and of a training stream: rollouts that failed for reasons
outside the policy stay out of group rewards, means and advantages (their rows stay); a group
with fewer than 2 that count has no advantages; a training stream asks the endpoint for token
ids in each dialect's way and refuses an endpoint that returns none."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import vfray as vf
from vfray.episode import finalize_episode, infra_failure
from vfray.errors import ConfigError, HarnessError, PhaseTimeoutError, ProviderError
from vfray.interception.dialects.anthropic import AnthropicDialect
from vfray.interception.dialects.chat import ChatDialect
from vfray.interception.dialects.responses import ResponsesDialect
from vfray.scoring import score_rollout
from vfray.trace import Message, Trace


class QA(vf.TaskData):
    answer: str


class Graded(vf.Task[QA]):
    seen: list[int] = []

    @vf.reward
    def exact(self, trace: Trace) -> bool:
        return (trace.last_reply or "").strip() == self.data.answer

    @vf.group_reward
    def size(self, traces: list[Trace]) -> list[float]:
        Graded.seen.append(len(traces))
        return [0.0] * len(traces)


def _trace(
    task: Graded, reply: str, index: int, error: Exception | None = None, phase: str = "agent"
) -> Trace:
    trace = Trace(task=task.record(), rollout_index=index)
    trace.record_call(task.data.prompt_messages, Message(role="assistant", content=reply))
    if error is not None:
        trace.add_error(error, phase)
    return trace


async def _episode(
    errors: list[tuple[Exception | None, str]], count_failed: bool = False
) -> vf.Episode:
    task = Graded(QA(prompt="6*7?", answer="42"))
    replies = ["42", "41", "42", "42"]
    traces = [_trace(task, replies[i], i, err, phase) for i, (err, phase) in enumerate(errors)]
    for trace in traces:
        await score_rollout(task, trace)
    return await finalize_episode(task, traces, count_failed=count_failed)


async def test_infrastructure_failures_stay_out_of_the_group() -> None:
    Graded.seen = []
    episode = await _episode(
        [
            (None, "agent"),
            (None, "agent"),
            (HarnessError("agent crashed"), "agent"),  # scored 1.0, but a crash says nothing
            (PhaseTimeoutError("agent phase exceeded 5s"), "agent"),  # the policy looped: counts
        ]
    )
    assert episode.rewards == [1.0, 0.0, 1.0, 1.0]  # the rows keep their own reward
    assert episode.counted == [True, True, False, True]
    assert episode.mean_reward == pytest.approx(2 / 3)
    assert episode.advantages == pytest.approx([1 / 3, -2 / 3, None, 1 / 3])  # type: ignore[arg-type]
    assert episode.trainable
    assert Graded.seen == [3]  # the group reward saw only the rollouts that count
    assert episode.group_rewards["size"] == [0.0, 0.0, None, 0.0]
    assert "size" not in episode.traces[2].rewards

    # Configurable: counting them brings the crashed rollout back in.
    Graded.seen = []
    counted = await _episode([(None, "agent")] * 2 + [(HarnessError("x"), "agent")] * 2, True)
    assert counted.counted == [True] * 4 and Graded.seen == [4]
    assert counted.mean_reward == pytest.approx(0.75)


async def test_a_group_with_fewer_than_two_counted_rollouts_has_no_advantages() -> None:
    Graded.seen = []
    episode = await _episode(
        [
            (None, "agent"),
            (ProviderError("503"), "agent"),
            (PhaseTimeoutError("boot phase exceeded 60s"), "boot"),
            (HarnessError("x"), "agent"),
        ]
    )
    assert episode.counted == [True, False, False, False]
    assert not episode.trainable
    assert episode.advantages == [None] * 4
    assert Graded.seen == []  # no group to rank
    assert episode.mean_reward == 1.0


def test_which_failures_are_infrastructure() -> None:
    task = Graded(QA(prompt="q", answer="a"))
    assert not infra_failure(_trace(task, "a", 0))
    assert infra_failure(_trace(task, "a", 0, ProviderError("x")))
    assert infra_failure(_trace(task, "a", 0, PhaseTimeoutError("x"), "setup"))
    assert not infra_failure(_trace(task, "a", 0, PhaseTimeoutError("x"), "agent"))


class FlakySetup(vf.Task[QA]):
    """Rollout 0 of every task fails in its setup: a TaskError, not a policy outcome."""

    @vf.reward
    def correct(self, trace: Trace) -> bool:
        return (trace.last_reply or "").strip() != ""

    def setup(self, trace: Trace, runtime: Any) -> None:
        if trace.rollout_index == 0:
            raise RuntimeError("fixture download failed")


def test_run_summary_reports_both_views(tmp_path: Path) -> None:
    tasks = [FlakySetup(QA(prompt=f"say {i}", answer=str(i)), key=f"t{i}") for i in range(3)]
    with vf.Farm(
        "scripted:echo", harness="null", backend="local", output_dir=str(tmp_path), progress=False
    ) as farm:
        result = farm.run(tasks, rollouts_per_task=2)
    summary = result.summary()
    assert summary["errors"] == {"TaskError": 3}
    # Each group has one rollout that counts: none is trainable, and the counted mean is 1.0.
    assert summary["groups_untrainable"] == 3
    assert summary["reward_mean_counted"] == 1.0
    advantages = result.episodes.column("advantages").to_pylist()
    assert advantages == [[None, None]] * 3
    from rich.console import Console

    from vfray.cli.report import results_table

    console = Console(record=True, width=120)
    console.print(results_table(summary))
    text = console.export_text()
    assert "groups with < 2 counted rollouts" in text
    # The failed rollouts were never scored, so both means agree and one line says it.
    assert summary["reward_mean"] == 1.0
    assert "infra failures left out" not in text


def test_a_plain_eval_reports_no_untrainable_groups(tmp_path: Path) -> None:
    # -r 1, the default: no group was meant to be compared, so none is "untrainable", even
    # with failed rollouts.
    tasks = [FlakySetup(QA(prompt=f"say {i}", answer=str(i)), key=f"t{i}") for i in range(3)]
    with vf.Farm(
        "scripted:echo", harness="null", backend="local", output_dir=str(tmp_path), progress=False
    ) as farm:
        summary = farm.run(tasks).summary()
    assert summary["errors"] == {"TaskError": 3}
    assert "groups_untrainable" not in summary
    from rich.console import Console

    from vfray.cli.report import results_table

    console = Console(record=True, width=120)
    console.print(results_table(summary))
    assert "counted rollouts" not in console.export_text()


def test_each_dialect_asks_for_tokens_its_own_way() -> None:
    chat = ChatDialect().impose({"messages": []}, "m", {"return_tokens": True, "temperature": 1})
    assert chat["logprobs"] is True and chat["return_token_ids"] is True
    assert "return_tokens" not in chat and chat["temperature"] == 1
    body = {"input": "x", "include": ["reasoning.encrypted_content"]}
    responses = ResponsesDialect().impose(body, "m", {"return_tokens": True})
    assert responses["include"] == ["reasoning.encrypted_content", "message.output_text.logprobs"]
    assert responses["return_token_ids"] is True
    anthropic = AnthropicDialect().impose({"messages": []}, "m", {"return_tokens": True})
    assert anthropic["return_token_ids"] is True and "return_tokens" not in anthropic
    required = ChatDialect().impose({"messages": []}, "m", {"return_tokens": "required"})
    assert required["return_token_ids"] is True and "return_tokens" not in required
    plain = ChatDialect().impose({"messages": []}, "m", {"return_tokens": None})
    assert "logprobs" not in plain and "return_tokens" not in plain


async def _first_group(farm: vf.Farm, **kwargs: Any) -> vf.EpisodeGroup:
    async for group in farm.stream(EndlessSums(), rollouts_per_task=2, **kwargs):
        return group
    raise AssertionError("no group")


class Sums(vf.Task[QA]):
    @vf.reward
    def correct(self, trace: Trace) -> bool:
        return (trace.last_reply or "").strip().endswith(self.data.answer)


class EndlessSums(vf.Taskset[Sums]):
    def load(self) -> list[Sums]:
        return [
            Sums(QA(prompt=f"What is {i} + 1?", answer=str(i + 1)), key=str(i)) for i in range(4)
        ]


def test_a_training_stream_gets_token_ids_without_asking(tmp_path: Path) -> None:
    # No sampling={"logprobs": True}: the stream asks the endpoint for tokens by itself.
    with vf.Farm(
        "scripted:arithmetic",
        harness="null",
        backend="local",
        output_dir=str(tmp_path),
        progress=False,
    ) as farm:
        farm.set_policy_version(3)
        group = asyncio.run(_first_group(farm))
    for trace in group.traces:
        (call,) = trace.calls
        assert call.completion_token_ids and call.prompt_token_ids and call.completion_logprobs
        assert call.policy_version == 3  # set before the stream re-resolved the farm
    samples = vf.to_samples(group.table)
    assert samples.column("completion_token_ids").null_count == 0


def test_a_training_stream_refuses_a_known_tokenless_endpoint_before_anything_runs(
    tmp_path: Path,
) -> None:
    # ?tokens=0: the scripted model ignores requests for token ids, as OpenAI's API does.
    model = "scripted:echo?tokens=0"
    opts: dict[str, Any] = {"harness": "null", "backend": "local", "progress": False}
    with vf.Farm(model, output_dir=str(tmp_path), **opts) as farm:
        with pytest.raises(ConfigError, match="returned no token ids") as refused:
            farm.stream(EndlessSums(), rollouts_per_task=2)  # refused here, not when iterated
        assert not farm._started
    assert "\n" not in str(refused.value)
    assert not any(tmp_path.iterdir())  # no run folder: nothing ran
    openai = vf.Farm("gpt-4o", base_url="https://api.openai.com/v1/", **opts)
    with openai, pytest.raises(ConfigError, match="'gpt-4o' returned no token ids"):
        openai.stream(EndlessSums())
    # Streaming to evaluate, not to train, is still possible.
    with vf.Farm(model, output_dir=str(tmp_path), **opts) as farm:
        group = asyncio.run(_first_group(farm, tokens=False))
    assert group.traces[0].calls[0].completion_token_ids is None


class SlowSecond(vf.Task[QA]):
    """Rollout 1 of each task waits a minute before its agent starts."""

    @vf.reward
    def correct(self, trace: Trace) -> bool:
        return True

    async def setup(self, trace: Trace, runtime: Any) -> None:
        if trace.rollout_index == 1:
            await asyncio.sleep(60)


def test_a_training_stream_refuses_an_endpoint_without_token_ids_at_its_first_answer(
    tmp_path: Path,
) -> None:
    # A remote endpoint (the scripted model served on its own, tokens=False) is not known to
    # lack token ids: the first answer without them stops the stream, long before any group
    # (whose second rollout is still in its setup) completes.
    from vfray.models.scripted.server import scripted_server

    tasks = [SlowSecond(QA(prompt=f"say {i}", answer=str(i)), key=f"t{i}") for i in range(3)]
    groups: list[vf.EpisodeGroup] = []

    async def train(farm: vf.Farm) -> None:
        async for group in farm.stream(tasks, rollouts_per_task=2):
            groups.append(group)

    refusal = pytest.raises(ConfigError, match="'echo' returned no token ids")
    with scripted_server("echo", tokens=False) as url:
        started = time.monotonic()
        farm = vf.Farm(
            "echo",
            base_url=url,
            harness="null",
            backend="local",
            output_dir=str(tmp_path),
            progress=False,
        )
        with farm, refusal as refused:
            asyncio.run(train(farm))
        elapsed = time.monotonic() - started
    assert "\n" not in str(refused.value)
    assert groups == [] and elapsed < 30  # the slow rollouts were cancelled, not waited for
    (run_dir,) = tmp_path.iterdir()
    assert vf.RunResult(run_dir).episodes.num_rows == 0  # no group was scored


async def test_summary_leaves_scored_infrastructure_failures_out_of_the_counted_mean() -> None:
    from vfray.run.results import summarize
    from vfray.traces.convert import traces_to_table

    episode = await _episode(
        [(None, "agent"), (None, "agent"), (HarnessError("crash"), "agent"), (None, "agent")]
    )
    summary = summarize(traces_to_table(episode.traces))
    assert summary["reward_mean"] == pytest.approx(0.75)  # every scored row
    assert summary["reward_mean_counted"] == pytest.approx(2 / 3)  # the crash left out
