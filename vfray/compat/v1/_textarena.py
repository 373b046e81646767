"""v1's TextArena taskset (``verifiers.v1.tasksets.textarena``, which verifiers' ``wordle``
example pins to ``Wordle-v0``): seeded games whose engine plays the user, the model's replies
stepping the game host-side and the engine's outcome its ``game_reward``.

Importing it needs nothing (so a package that subclasses its classes loads); loading its tasks
needs ``textarena`` and ``nltk``, and nltk's ``words`` and ``averaged_perceptron_tagger_eng``
data, which v1 downloads at load time: offline (or without the packages) the load is one line
naming what is missing, where v1 fails inside nltk's downloader.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Iterator
from typing import Any, Literal

from vfray.compat.v1._data import TaskConfig, TaskData, TasksetConfig
from vfray.compat.v1._env import AgentConfig, Env, EnvConfig
from vfray.compat.v1._task import State, Task
from vfray.compat.v1._taskset import Taskset
from vfray.errors import ConfigError

SYSTEM_PROMPT = (
    "You are a competitive game player. Read the game instructions carefully and always "
    "use the exact move format the game requires. Think step-by-step first, then give your "
    "move as the only square-bracketed token in your reply — the game reads the first "
    "bracketed token, so don't put other words in brackets."
)
"""v1's system prompt for every game, word for word (the transcripts compare equal)."""

_NLTK_DATA = {
    "words": "corpora/words",
    "averaged_perceptron_tagger_eng": "taggers/averaged_perceptron_tagger_eng",
}


def _textarena() -> Any:
    """``textarena``, with nltk's data in place; one line naming whatever is missing."""
    try:
        import nltk  # type: ignore[import-not-found]
        import textarena  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ConfigError(
            f"verifiers.v1.tasksets.textarena needs textarena and nltk ({exc.name} is not "
            "installed: pip install textarena nltk)"
        ) from None
    missing = []
    for name, where in _NLTK_DATA.items():
        try:
            nltk.data.find(where)
        except LookupError:
            # v1 downloads it here; quietly, so offline it only finds it still missing.
            if not nltk.download(name, quiet=True, raise_on_error=False):
                missing.append(name)
    if missing:
        raise ConfigError(
            f"verifiers.v1.tasksets.textarena needs nltk's {' and '.join(missing)} data, which "
            "could not be downloaded (offline?): fetch it with nltk.download() where the "
            "internet is reachable and point NLTK_DATA at it"
        )
    return textarena


def _latest_feedback(observation: str) -> str:
    """The newest game message only (the engine repeats the whole history)."""
    latest = observation.split("[GAME]")[-1].strip()
    return latest.split("Feedback:")[-1].strip() if "Feedback:" in latest else latest


class TextArenaConfig(TasksetConfig):
    game: Literal["Wordle-v0", "Wordle-v0-long", "Hangman-v0", "WordLadder-v0", "WordSearch-v0"]


class TextArenaData(TaskData):
    info: dict[str, Any]
    """The game id and seed the env replays the episode from."""


class TextArenaTask(Task[TextArenaData, State, TaskConfig]):
    pass


class TextArenaEnvConfig(EnvConfig):
    player: AgentConfig = AgentConfig()


class TextArenaEnv(Env[TextArenaEnvConfig]):
    """The engine plays the user: each reply is a move, each observation the next turn."""

    async def run(self, task: Any, agents: Any) -> None:
        ta = _textarena()
        # textarena seeds with the process-wide RNG: seed, make and reset with no await between.
        random.seed(task.data.info["seed"])
        game = ta.make(env_id=task.data.info["game"])
        game.reset(num_players=1)
        outcome: dict[str, Any] = {}
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                game.step(segment.last_reply)
                if game.state.done:
                    outcome["reward"] = float((game.state.rewards or {}).get(0, 0.0))
                    outcome["reason"] = str(game.state.game_info[0]["reason"])
                    break
                _, observation = game.get_observation()
                segment = await interaction.turn(_latest_feedback(str(observation)))
        trace = interaction.trace
        trace.record_reward("game_reward", outcome.get("reward", 0.0), 1.0)
        if "reason" in outcome:
            trace.info["game_outcome"] = outcome["reason"]


class TextArenaTaskset(Taskset[TextArenaTask, TextArenaConfig]):
    INFINITE = True

    def load(self) -> Iterator[TextArenaTask]:
        ta = _textarena()
        template = ta.make(env_id=self.config.game)

        def observation(seed: int) -> str:
            random.seed(seed)
            env = copy.deepcopy(template)
            env.reset(num_players=1)
            return str(env.get_observation()[1])

        # One prompt for all when the first board does not depend on the seed, as in v1.
        first = observation(0)
        seeded = observation(1) != first
        for i in itertools.count():
            yield TextArenaTask(
                TextArenaData(
                    name=f"{self.config.game}#{i}",
                    prompt=observation(i) if seeded else first,
                    system_prompt=SYSTEM_PROMPT,
                    info={"game": self.config.game, "seed": i},
                ),
                self.config.task,
            )
