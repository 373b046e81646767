"""v1's ``user-sim`` env (``--env.id user-sim``): a modeled user (seat ``user``, tool-less
``null`` harness) is given the task's prompt as its scenario and talks to the assistant (seat
``assistant``), which plays the task with its prompt hidden, until the user says the done marker.
Played by vfray's seats; the task's rewards score the assistant's side."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from vfray.compat.v1._data import TaskData
from vfray.compat.v1._env import AgentConfig, Env, EnvConfig, Episode, HarnessConfig
from vfray.compat.v1._task import Task

PERSONA = """You are role-playing a USER talking to an AI assistant. This is your situation — what you want the ASSISTANT to do for you:

{scenario}

Rules:
- Open the conversation with your request, in your own words.
- Stay in character: short, natural user messages; never act as the assistant.
- The assistant does the work, not you: never perform the task yourself — any tool call, answer, or output format it asks for must come from the assistant; ask for it instead.
- Reveal details only when asked, as a real user would.
- When the assistant has fully met your goal — or you are convinced it cannot — reply with exactly {done} and nothing else."""  # noqa: E501  (v1's text, kept verbatim: the user model sees it)

DONE = "###DONE###"
GREETING = "Hello! How can I help you today?"


class UserSimEnvConfig(EnvConfig):
    assistant: AgentConfig = Field(default_factory=AgentConfig)
    user: AgentConfig = Field(
        default_factory=lambda: AgentConfig(harness=HarnessConfig(id="null"), max_turns=8)
    )
    persona: str = PERSONA
    done_marker: str = Field(DONE, min_length=1)


class UserSimEnv(Env[UserSimEnvConfig]):
    def __init__(self, config: UserSimEnvConfig | None = None) -> None:
        super().__init__(config if config is not None else UserSimEnvConfig())

    async def setup(self, agents: Any) -> None:
        agents.user.trainable = False  # as v1's: the modeled user is not the policy

    async def run(self, task: Any, agents: Any) -> None:
        persona = self.config.persona.replace("{done}", self.config.done_marker)
        user_task = Task(
            TaskData(
                idx=task.data.idx,
                prompt=None,
                system_prompt=persona.replace("{scenario}", task.data.prompt_text),
            )
        )
        assistant_task = type(task)(task.data.model_copy(update={"prompt": None}), task.config)
        async with (
            agents.user.interaction(user_task) as sim,
            agents.assistant.interaction(assistant_task) as assistant,
        ):
            ask = await sim.turn(GREETING)
            while not ask.terminated and ask.last_reply.strip() != self.config.done_marker:
                answer = await assistant.turn(ask.last_reply)
                if answer.terminated:
                    break
                ask = await sim.turn(answer.last_reply)

    async def finalize(self, task: Any, episode: Episode) -> None:
        users = [t for t in episode.traces if t.agent.name == "user"]
        for trace in episode.traces:
            if trace.agent.name == "assistant" and users:
                trace.record_metric("user_turns", float(users[0].num_turns))
