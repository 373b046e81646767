"""verifiers v1 envs with their own ``run(task, agents)`` on vfray's seats: a package's two-agent
env (tests/v1_tasksets/v1seats) and v1's ``user-sim`` env over a user-simulation taskset
(tests/v1_tasksets/v1user), played in process and on the local farm with the scripted model
(its ``user`` policy as the simulated user); what does not map is refused in one line."""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import vfray as vf
from vfray.cli.main import main
from vfray.compat.v1 import loader
from vfray.compat.v1._seated import turn_content
from vfray.compat.v1.traces import export_run, plain_message, read_v1_traces, to_v1_trace
from vfray.errors import ConfigError
from vfray.models.scripted.policies import describe_images
from vfray.models.scripted.server import scripted_server
from vfray.run.environment import run_game
from vfray.trace import Trace
from vfray.traces import read_traces
from vfray.traces.convert import table_to_traces

PACKAGES = Path(__file__).parent / "v1_tasksets"
SEATS = str(PACKAGES / "v1seats")
USER = str(PACKAGES / "v1user")


def _said(trace: Trace, role: str) -> list[str]:
    return [m.text for m in trace.messages if m.role == role]


def _first(taskset: Any) -> Any:
    return next(iter(taskset.load()))


async def test_a_v1_two_agent_env_plays_its_run_as_vfray_seats() -> None:
    task = _first(loader.load(SEATS, env_args={"bonus": 2}))
    solver, checker = await run_game(task, model="scripted:arithmetic", harness="null")
    assert (solver.seat, checker.seat) == ("solver", "checker")
    # agents.solver.run(task): the task's prompt, one turn.
    assert _said(solver, "user") == ["What is 2 + 3?"] and solver.last_reply == "5"
    # agents.checker.interaction(its own task): its system prompt, two turns fed by run().
    assert _said(checker, "system") == ["You check sums."]
    assert _said(checker, "user") == ["What is 5 + 2?", "What is 7 + 2?"]
    assert len(checker.segments) == 2
    # Each seat scores the v1 task it played: the checker's plain task has no `correct`.
    assert solver.rewards["correct"].value == 1.0 and "correct" not in checker.rewards
    # Env.finalize saw both traces, stamped with their seat names.
    assert solver.rewards["chain"].value == checker.rewards["chain"].value == 1.0
    assert solver.metrics["seats"] == checker.metrics["seats"] == 2.0
    assert solver.metrics["checker_turns"] == 2.0
    assert solver.reward == 1.5 and solver.task.key == checker.task.key == task.key


async def test_v1_user_sim_hides_the_scenario_from_the_assistant() -> None:
    taskset = loader.load(USER, env_id="user-sim", env_args={"user": {"model": "scripted:user"}})
    user, assistant = await run_game(_first(taskset), model="scripted:arithmetic", harness="null")
    assert (user.seat, assistant.seat) == ("user", "assistant")
    assert (user.agent.harness, user.agent.model) == ("null", "scripted:user")
    # The user's persona carries the scenario; it opens after the assistant's greeting ...
    (persona,) = _said(user, "system")
    assert "> What is 2 + 3?" in persona and "###DONE###" in persona
    assert _said(user, "user") == ["Hello! How can I help you today?", "5", "8"]
    assert _said(user, "assistant")[-1] == "###DONE###"
    # ... and the assistant only ever hears what the user says.
    assert _said(assistant, "user") == ["What is 2 + 3?", "What is 4 + 4?"]
    assert not _said(assistant, "system")
    assert assistant.rewards["correct"].value == 1.0 and assistant.metrics["replies"] == 2.0
    assert assistant.metrics["user_turns"] == 3.0  # UserSimEnv.finalize, from the user's trace
    assert "correct" not in user.rewards  # scored by the task it played (v1's user task)
    assert not user.agent.trainable and assistant.agent.trainable  # UserSimEnv.setup


def test_user_sim_runs_from_vf_eval_flags_on_the_local_farm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [
        "--env.id",
        "user-sim",
        "--env.user.model",
        "scripted:user",
        "--env.user.max-turns",
        "5",
    ]
    assert main(["eval", USER, *flags, "--env.agent.harness.id", "null", "--dry-run"]) == 0
    captured = capsys.readouterr()
    config = json.loads(captured.out)
    assert config["taskset_args"]["env"] == {
        "id": "user-sim",
        "user": {"model": "scripted:user", "max_turns": 5},
    }
    assert "v1 env.user.model = 'scripted:user' -> env user.model" in captured.err
    taskset = loader.load_from_args(USER, config["taskset_args"])
    with (
        scripted_server("arithmetic") as url,
        vf.Farm(
            model="scripted",
            base_url=url,
            harness="null",
            backend="local",
            progress=False,
            output_dir=str(tmp_path),
        ) as farm,
    ):
        result = farm.run(taskset)
    outcomes = read_v1_traces(export_run(result.run_dir))
    assistant = [o for o in outcomes if o.rewards.get("correct") is not None]
    assert sorted(o.rewards["correct"] for o in assistant) == [1.0, 1.0]
    assert sorted(o.metrics["user_turns"] for o in assistant) == [2.0, 3.0]


@pytest.mark.parametrize(
    ("env_id", "env_args", "match"),
    [
        ("user-sim", {"user": {"runtime": {"type": "prime"}}}, "env.user.runtime.type=prime"),
        ("user-sim", {"user": {"runtime": {"image": "x"}}}, "env.user.runtime.image"),
        ("user-sim", {"user": {"harness": {"id": "opencode"}}}, "env.user.harness.id=opencode"),
        ("user-sim", {"colour": "red"}, "env.colour"),
        ("agentic-judge", {}, "'agentic-judge' is not supported"),
        (None, {"solver": {"model": "x"}}, "no env"),
    ],
)
def test_what_a_v1_env_asks_and_vfray_cannot_honour_is_one_line(
    env_id: str | None, env_args: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        loader.load(USER, env_id=env_id, env_args=env_args)


def test_a_v1_seats_model_endpoint_and_limits_map_onto_its_vfray_agent() -> None:
    seat = {
        "model": "judge-m",
        "client": {"base_url": "http://127.0.0.1:9/v1", "api_key_var": "K"},
        "harness": {"id": "mini_swe_agent"},
        "max_turns": 3,
        "runtime": {"type": "docker"},
    }
    task = _first(loader.load(SEATS, env_args={"checker": seat}))
    solver, checker = task.seats()
    assert solver.agent == vf.Agent(name="solver")  # left open: the run's own
    assert (checker.agent.model, checker.agent.base_url, checker.agent.api_key_var) == (
        "judge-m",
        "http://127.0.0.1:9/v1",
        "K",
    )
    assert (checker.agent.harness, checker.agent.runtime) == ("mini-swe-agent", "docker")
    assert checker.agent.limits is not None
    assert checker.agent.limits.max_turns == 3
    with pytest.raises(ConfigError, match=r"env\.checker\.client\.headers"):
        loader.load(SEATS, env_args={"checker": {"client": {"headers": {"a": "b"}}}})


async def test_a_v1_env_that_reruns_a_seat_plays_each_run_as_a_rollout(tmp_path: Path) -> None:
    # v1 fans a seat out: each `agents.X.run` in one episode is its own rollout and trace.
    # The second run's trace is seat `agent#2`; v1's `trace.agent.name` is `agent` for both,
    # and `agents.agent.trainable = False` (set in setup) leaves both out of training.
    pkg = tmp_path / "v1twice"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import verifiers.v1 as vf\n"
        "class Tasks(vf.Taskset):\n"
        "    def load(self):\n"
        "        yield vf.Task(vf.TaskData(prompt='What is 1 + 1?'), self.config.task)\n"
        "class Twice(vf.Env[vf.SingleAgentEnvConfig]):\n"
        "    async def setup(self, agents):\n"
        "        agents.agent.trainable = False\n"
        "    async def run(self, task, agents):\n"
        "        first = await agents.agent.run(task)\n"
        "        second = await agents.agent.run(task)\n"
        "        assert first is not second\n"
        "    async def finalize(self, task, episode):\n"
        "        names = [t.agent.name for t in episode.traces]\n"
        "        assert not any(t.agent.trainable for t in episode.traces)\n"
        "        for t in episode.traces:\n"
        "            t.record_metric('runs', float(len(names)))\n"
        "            t.record_metric('named_agent', float(names == ['agent', 'agent']))\n"
        "__all__ = ['Tasks', 'Twice']\n"
    )
    first, second = await run_game(
        _first(loader.load(str(pkg))), model="scripted:arithmetic", harness="null"
    )
    assert (first.seat, second.seat) == ("agent", "agent#2")
    assert first.trace_id != second.trace_id and first.ok and second.ok
    for trace in (first, second):
        assert _said(trace, "user") == ["What is 1 + 1?"] and trace.last_reply == "2"
        assert trace.metrics["runs"] == 2.0 and trace.metrics["named_agent"] == 1.0
        assert not trace.agent.trainable
    # The v1 export names both runs' agent `agent`, not trainable, as v1 writes them.
    exported = [to_v1_trace(t)["agent"] for t in (first, second)]
    assert [(a["name"], a["trainable"]) for a in exported] == [("agent", False)] * 2


async def test_a_seat_fanned_out_in_a_task_group_plays_every_attempt(tmp_path: Path) -> None:
    # code_golf's shape (vf.Agents as an annotation is served): the attempts run concurrently
    # in a TaskGroup, and so they play on vfray, each run its own trace: each attempt's setup
    # waits (up to 60 s) for all three to have started, which one at a time never happens.
    pkg = tmp_path / "fanned"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import asyncio\n"
        "import verifiers.v1 as vf\n"
        "ARRIVED = []\n"
        "class Met(vf.Task):\n"
        "    async def setup(self, trace, runtime):\n"
        "        ARRIVED.append(1)\n"
        "        for _ in range(1200):\n"
        "            if len(ARRIVED) >= 3:\n"
        "                break\n"
        "            await asyncio.sleep(0.05)\n"
        "        trace.record_metric('met', float(len(ARRIVED) >= 3))\n"
        "class Tasks(vf.Taskset):\n"
        "    def load(self):\n"
        "        yield Met(vf.TaskData(prompt='What is 1 + 1?'), self.config.task)\n"
        "class Fanned(vf.Env[vf.SingleAgentEnvConfig]):\n"
        "    async def run(self, task: vf.Task, agents: vf.Agents) -> None:\n"
        "        async with asyncio.TaskGroup() as tg:\n"
        "            for _ in range(3):\n"
        "                tg.create_task(agents.agent.run(task))\n"
        "__all__ = ['Tasks', 'Fanned']\n"
    )
    traces = await run_game(
        _first(loader.load(str(pkg))), model="scripted:arithmetic", harness="null"
    )
    assert [t.seat for t in traces] == ["agent", "agent#2", "agent#3"]
    assert all(t.ok and t.last_reply == "2" for t in traces)
    assert [t.metrics.get("met") for t in traces] == [1.0, 1.0, 1.0]
    assert len({t.trace_id for t in traces}) == 3


_PROPOSER_SOLVER = """
import asyncio
from pydantic import Field
import verifiers.v1 as vf

class SolveData(vf.TaskData):
    answer: str

class SolveTask(vf.Task[SolveData]):
    @classmethod
    def from_trace(cls, proposer):
        n = int(proposer.last_reply)
        return cls(SolveData(idx=proposer.task.data.idx, prompt=f"What is {n} + 1?",
                             answer=str(n + 1)))

    @vf.reward
    async def correct(self, trace) -> float:
        return float(trace.last_reply == self.data.answer)

class Config(vf.EnvConfig):
    proposer: vf.AgentConfig = vf.AgentConfig()
    solver: vf.AgentConfig = vf.AgentConfig()
    n: int = Field(3, ge=1)
    train_proposer: bool = False

class ProposerSolver(vf.Env[Config]):
    async def setup(self, agents: vf.Agents) -> None:
        agents.proposer.trainable = self.config.train_proposer

    async def run(self, task, agents: vf.Agents) -> None:
        proposed = await agents.proposer.run(task)
        solve_task = SolveTask.from_trace(proposed)
        async with asyncio.TaskGroup() as tg:
            for _ in range(self.config.n):
                tg.create_task(agents.solver.run(solve_task))

    async def finalize(self, task, episode) -> None:
        solves = [t for t in episode.traces if t.agent.name == "solver"]
        rate = sum(r.score if (r := t.rewards.get("correct")) else 0.0 for t in solves)
        rate /= len(solves)
        for trace in episode.traces:
            if trace.agent.name == "proposer":
                trace.record_metric("solves", float(len(solves)))
                trace.record_reward("learnability", 4.0 * rate * (1.0 - rate))

class Tasks(vf.Taskset):
    def load(self):
        yield vf.Task(vf.TaskData(idx=7, prompt="What is 2 + 3?"), self.config.task)

__all__ = ["Tasks", "ProposerSolver"]
"""


def test_one_proposer_with_many_solvers_on_the_local_farm(tmp_path: Path) -> None:
    # proposer_solver's shape: the proposer's trace mints the solvers' task, which --env.n
    # runs of the solver seat solve in a TaskGroup; finalize reads `t.agent.name`. The
    # proposer is not trainable (its env's setup): no advantage, exported trainable false.
    pkg = tmp_path / "v1propose"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(_PROPOSER_SOLVER)
    taskset = loader.load(str(pkg), env_args={"n": 3})
    with vf.Farm(
        "scripted:arithmetic?accuracy=0.5&seed=1",
        harness="null",
        backend="local",
        output_dir=str(tmp_path / "out"),
        progress=False,
    ) as farm:
        result = farm.run(taskset, rollouts_per_task=1)
    rows = {r["seat"]: r for r in read_traces(result.run_dir / "traces").to_pylist()}
    assert sorted(rows) == ["proposer", "solver", "solver#2", "solver#3"]
    traces = {seat: Trace.model_validate_json(r["trace_json"]) for seat, r in rows.items()}
    proposer = traces.pop("proposer")
    assert not proposer.agent.trainable and rows["proposer"]["advantage"] is None
    question = f"What is {proposer.last_reply} + 1?"
    for solver in traces.values():
        assert [m.text for m in solver.messages if m.role == "user"] == [question]
    # Each solver is scored by the minted SolveTask's own `correct`; Env.finalize runs after
    # every seat's scoring (as in v1), so the proposer's learnability reads them.
    solved = [t.rewards["correct"].value for t in traces.values()]
    assert set(solved) == {0.0, 1.0}  # the scripted model's 50% accuracy, seed 1
    rate = sum(v or 0.0 for v in solved) / 3
    assert proposer.metrics["solves"] == 3.0
    assert proposer.rewards["learnability"].value == pytest.approx(4 * rate * (1 - rate))
    # The solver's three runs are one group: their advantages sum to 0.
    advantages = [rows[s]["advantage"] for s in traces]
    assert None not in advantages and sum(advantages) == pytest.approx(0.0)
    lines = export_run(result.run_dir, tmp_path / "v1.jsonl").read_text().splitlines()
    (episode,) = [json.loads(line)["traces"] for line in lines]
    agents = sorted((t["agent"]["name"], t["agent"]["trainable"]) for t in episode)
    assert agents == [("proposer", False)] + [("solver", True)] * 3


_JUDGED = """
import verifiers.v1 as vf

class QA(vf.TaskData):
    answer: str

class Tasks(vf.Taskset):
    def load(self):
        for q, a in (("What is 2 + 3?", "5"), ("What is 1 + 1?", "3")):
            yield vf.Task(QA(prompt=q, answer=a), self.config.task)

__all__ = ["Tasks"]
"""


def test_a_plugged_v1_reference_judge_is_a_vfray_judge_reward(tmp_path: Path) -> None:
    pkg = tmp_path / "v1judged"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(_JUDGED)
    judges = [{"id": "reference", "name": "matches", "weight": 0.5}]
    taskset = loader.load(str(pkg), config={"task": {"judges": judges}})
    with (
        scripted_server("arithmetic") as url,
        vf.Farm(
            model="scripted",
            base_url=url,
            harness="null",
            backend="local",
            progress=False,
            output_dir=str(tmp_path / "out"),
        ) as farm,
    ):
        result = farm.run(taskset)
    found = table_to_traces(read_traces(Path(result.run_dir) / "traces"))
    traces = sorted(found, key=lambda t: t.last_reply or "")
    # The scripted judge says yes when the reference answer is in the reply: 5 yes, 2 (not 3) no.
    assert [(t.last_reply, t.rewards["matches"].value) for t in traces] == [("2", 0.0), ("5", 1.0)]
    assert [t.reward for t in traces] == [0.0, 0.5]
    for trace in traces:
        (call,) = trace.side_calls
        assert call.kind == "judge" and call.name == "matches"
        assert "Reference answer:" in call.messages[-1].text


@pytest.mark.parametrize(
    ("judges", "match"),
    [
        ([{"id": "rubric"}], "v1 judge 'rubric' is not supported"),
        ([{"id": "reference", "prompt": "p.txt"}], "judge options not supported by vfray: prompt"),
    ],
)
def test_v1_judges_vfray_cannot_run_are_one_line(
    tmp_path: Path, judges: list[dict[str, Any]], match: str
) -> None:
    pkg = tmp_path / f"v1judged_{len(judges[0])}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(_JUDGED)
    with pytest.raises(ConfigError, match=match):
        loader.load(str(pkg), config={"task": {"judges": judges}}).tasks()


_TOOLED = """
import verifiers.v1 as vf

class Doubler(vf.Toolset[vf.ToolsetConfig]):
    @vf.tool
    async def double(self, x: int) -> str:
        "Twice x."
        return str(2 * x)

class Bare(Doubler):
    TOOL_PREFIX = None

class Named(Doubler):
    TOOL_PREFIX = "calc"

class Tooled(vf.Task):
    @classmethod
    def toolsets(cls, config):
        return [Doubler(vf.ToolsetConfig())]

    @vf.reward
    async def doubled(self, trace) -> float:
        return float("42" in trace.last_reply)

class Tasks(vf.Taskset):
    def load(self):
        yield Tooled(vf.TaskData(prompt='tool: doubler_double {"x": 21}'), self.config.task)

__all__ = ["Tasks"]
"""


def _tooled(tmp_path: Path, body: str = _TOOLED) -> Path:
    pkg = tmp_path / f"v1tooled_{tmp_path.name}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    return pkg


async def test_a_v1_tasks_toolset_is_served_as_a_vfray_toolset(tmp_path: Path) -> None:
    task = _first(loader.load(str(_tooled(tmp_path)), harness_chosen=True))
    trace = await vf.run_rollout(task, model="scripted:agent", harness="bash", runtime="subprocess")
    assert trace.errors == []
    assert [(c.server, c.name, c.arguments, c.result) for c in trace.tool_calls] == [
        ("doubler", "doubler_double", {"x": 21}, "42")
    ]
    assert trace.rewards["doubled"].value == 1.0


def test_v1_toolsets_advertise_v1s_tool_names(tmp_path: Path) -> None:
    # v1 shows the model `<TOOL_PREFIX or snake-cased class>_<tool>`, bare with TOOL_PREFIX None
    # (verifiers/v1/mcp/server.py: ServerBase.server_name); the comparison test measures it.
    pkg = _tooled(tmp_path)
    loader.load(str(pkg))
    module = sys.modules[pkg.name]
    assert list(module.Doubler.specs()) == ["doubler_double"]
    assert list(module.Bare.specs()) == ["double"]
    assert [s.name for s in module.Named.specs().values()] == ["calc_double"]


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ("vf.ToolsetConfig(colocated=True)", "config colocated=True is not supported"),
        ("vf.ToolsetConfig(url='http://x/mcp')", "url='http://x/mcp'"),
        ("vf.ToolsetConfig(runtime={'type': 'docker'})", "runtime={'type': 'docker'}"),
    ],
)
def test_a_v1_toolset_config_vfray_cannot_honour_is_one_line(
    tmp_path: Path, config: str, match: str
) -> None:
    pkg = _tooled(tmp_path, _TOOLED.replace("Doubler(vf.ToolsetConfig())", f"Doubler({config})"))
    with pytest.raises(ConfigError, match=re.escape(match)):
        loader.load(str(pkg)).tasks()


def test_a_v1_two_agent_env_plays_on_ray_workers(ray_local: None, tmp_path: Path) -> None:
    # The package ships by value; each host serves verifiers.v1 from vfray and plays the game.
    taskset = loader.load(SEATS)
    with (
        scripted_server("arithmetic") as url,
        vf.Farm(
            model="scripted", base_url=url, harness="null", progress=False, output_dir=str(tmp_path)
        ) as farm,
    ):
        result = farm.run(taskset)
    traces = table_to_traces(read_traces(Path(result.run_dir) / "traces"))
    by_seat: dict[str, list[Trace]] = {}
    for trace in traces:
        by_seat.setdefault(trace.seat or "", []).append(trace)
    assert sorted(by_seat) == ["checker", "solver"] and len(traces) == 4
    assert sorted(t.last_reply for t in by_seat["solver"]) == ["5", "8"]
    assert sorted(t.last_reply for t in by_seat["checker"]) == ["10", "7"]
    assert all(t.rewards["chain"].value == 1.0 for t in traces)
    assert all(t.rewards["correct"].value == 1.0 for t in by_seat["solver"])


_SHARED = """
import verifiers.v1 as vf

class Counter(vf.Toolset[vf.SharedToolsetConfig]):
    def __init__(self, config):
        super().__init__(config)
        self.hits = 0

    @vf.tool
    async def hit(self) -> str:
        "Count a call, over the whole run."
        self.hits += 1
        self.state["mine"] = self.state.get("mine", 0) + 1
        return f"{self.hits} {self.state['mine']}"

class Counted(vf.Task):
    @vf.reward
    async def counted(self, trace) -> float:
        return float(trace.last_reply.split()[-2])

class Tasks(vf.Taskset):
    @classmethod
    def toolsets(cls, config):
        return [Counter(vf.SharedToolsetConfig())]

    def load(self):
        for _ in range(2):
            yield Counted(vf.TaskData(prompt="tool: counter_hit {}"), self.config.task)

__all__ = ["Tasks"]
"""


async def test_a_v1_tasksets_shared_toolset_is_one_instance_for_the_run(tmp_path: Path) -> None:
    # v1's Taskset.toolsets: one server for the whole taskset; vfray serves it in its shared
    # scope: the second rollout's call sees the first's count, each rollout its own state.
    pkg = _tooled(tmp_path, _SHARED)
    # Each task crosses a process boundary as on Ray (its own copy of everything it holds):
    # a per-rollout toolset would count from 1 in each.
    loaded = loader.load(str(pkg), harness_chosen=True).tasks()
    tasks = [cloudpickle.loads(cloudpickle.dumps(t)) for t in loaded]
    replies = []
    for task in tasks:
        trace = await vf.run_rollout(
            task, model="scripted:agent", harness="bash", runtime="subprocess"
        )
        assert trace.errors == []
        [call] = trace.tool_calls
        replies.append(call.result)
        assert trace.rewards["counted"].value == float(len(replies))
    assert replies == ["1 1", "2 1"]


_IMAGE = (  # a 1x1 PNG
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQ"
    "GAhKmMIQAAAABJRU5ErkJggg=="
)
_PARTS = f"""
import verifiers.v1 as vf
from verifiers.v1.types import ImageUrlContentPart, ImageUrlSource, TextContentPart

class Tasks(vf.Taskset):
    def load(self):
        parts = [
            TextContentPart(text="What is 2 + 3?"),
            ImageUrlContentPart(image_url=ImageUrlSource(url={_IMAGE!r})),
        ]
        yield vf.Task(vf.TaskData(prompt=[vf.UserMessage(content=parts)]), self.config.task)

__all__ = ["Tasks"]
"""


async def test_a_list_of_content_parts_prompt_reaches_the_model_and_the_trace(
    tmp_path: Path,
) -> None:
    # color_codeword's shape: a user message of a text part and an image part.
    task = _first(loader.load(str(_tooled(tmp_path, _PARTS))))
    trace = await vf.run_rollout(task, model="scripted:arithmetic", harness="null")
    assert trace.errors == [] and trace.last_reply == "5"  # the text part was read
    assert trace.messages[0].content == [
        {"type": "text", "text": "What is 2 + 3?"},
        {"type": "image_url", "image_url": {"url": _IMAGE}},
    ]


_OTHER = "data:image/png;base64," + base64.b64encode(b"another image").decode()
_CODEWORD = f"""
import verifiers.v1 as vf

def shown(url, text):
    return [vf.ImageUrlContentPart(image_url=vf.ImageUrlSource(url=url)),
            vf.TextContentPart(text=text)]

class Tasks(vf.Taskset):
    def load(self):
        prompt = [vf.UserMessage(content=shown({_IMAGE!r}, "one"))]
        yield vf.Task(vf.TaskData(prompt=prompt), self.config.task)

class Codeword(vf.Env[vf.SingleAgentEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            await interaction.turn()
            await interaction.turn([vf.UserMessage(content=shown({_OTHER!r}, "two"))])
            await interaction.turn("three")

__all__ = ["Tasks", "Codeword"]
"""


async def test_a_v1_envs_turns_carry_their_images_to_the_model(tmp_path: Path) -> None:
    # color_codeword's shape: the prompt's image opens the exchange, a later turn is a user
    # message of content parts. The `images` model names each image of the last user turn, so
    # a turn that lost its image is answered "I see no image."
    task = _first(loader.load(str(_tooled(tmp_path, _CODEWORD))))
    [trace] = await run_game(task, model="scripted:images", harness="null")
    assert trace.ok, trace.errors
    first, second = ({"type": "image_url", "image_url": {"url": u}} for u in (_IMAGE, _OTHER))
    assert [m.content for m in trace.messages if m.role == "user"] == [
        [first, {"type": "text", "text": "one"}],
        [second, {"type": "text", "text": "two"}],
        "three",
    ]
    expected = [describe_images((_IMAGE,)), describe_images((_OTHER,)), "I see no image."]
    assert _said(trace, "assistant") == expected
    # The v1 export keeps the images, and the side-by-side comparison compares their URLs.
    users = [plain_message(n["message"]) for n in to_v1_trace(trace)["nodes"]]
    assert [m.get("images") for m in users if m["role"] == "user"] == [[_IMAGE], [_OTHER], None]
    # A turn of more than one message is refused in one line (vfray sends one user message).
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ConfigError, match=r"^interaction.turn\(\) got messages with roles"):
        turn_content(two)
