"""Example taskset: a support chat opened by a simulated customer. The tasks have no prompt: the
customer (a :class:`vfray.SimulatedUser`, played by a model with its own persona prompt) speaks
first, each of its messages resumes the agent, and it ends the chat by saying ``###DONE###``. A
rubric judge grades the agent's replies; the customer's and the judge's calls are kept on
``trace.side_calls``, never among the agent's calls or training samples.

Run: ``vfray eval examples/support_dialogue.py:SupportDialogues --harness null -m scripted:echo``
(the scripted model plays the agent by echoing, and the customer and the judge by their own
policies: it says the persona's ``> `` lines in order). With a real model, the same model plays
all three unless ``user_model`` / ``judge_model`` (and ``*_base_url``) name others.
"""

from __future__ import annotations

from collections.abc import Iterator

import vfray as vf
from vfray.judges import RubricJudge

AGENT_PROMPT = (
    "You are the support agent of Acme's online shop. Help the customer: confirm their order "
    "number, say what you will do about their problem, and keep each reply short."
)

CUSTOMER_PROMPT = """\
You are {customer}, writing to Acme's support chat about your order {order}: {issue}.
Write one short message per turn, as the customer (never as the agent). Bring these up, in order:
{script}
When your problem is solved, or the agent cannot help you, reply with ###DONE### only."""

TICKETS = (
    (
        "Dana",
        "#1042",
        "the mug arrived broken",
        ("Hi, my order #1042 arrived broken.", "Can I get a refund? Sorry to bother you."),
    ),
    (
        "Lee",
        "#2077",
        "the parcel never arrived",
        ("Hello, order #2077 never arrived.", "Please send a replacement.", "Thanks, that works."),
    ),
    (
        "Sam",
        "#3110",
        "the wrong size was sent",
        ("I got the wrong size for order #3110.", "A refund is fine, sorry for the hassle."),
    ),
)
"""(customer, order, issue, what the customer brings up in turn)."""


class Ticket(vf.TaskData):
    customer: str
    order: str
    issue: str
    script: str
    """The customer's talking points, one ``> `` line each."""


class SupportTask(vf.Task[Ticket]):
    customer = vf.SimulatedUser(CUSTOMER_PROMPT)
    service = RubricJudge(
        [
            {"name": "order", "description": 'names the order number ("order #")'},
            {"name": "refund", "description": 'offers a "refund"'},
            {"name": "apology", "description": 'apologizes ("sorry")'},
        ],
        view="replies",
        weight=0.5,
    )

    @vf.reward
    def closed_by_customer(self, trace: vf.Trace) -> bool:
        """The customer ended the chat (rather than a limit or an error)."""
        return trace.stop_condition is vf.StopCondition.USER_CLOSED

    @vf.metric
    def customer_turns(self, trace: vf.Trace) -> int:
        said = [c.reply for c in trace.side_calls if c.kind == "user" and c.reply]
        return sum(1 for reply in said if "###DONE###" not in reply)


def make_ticket(
    index: int, customer: str, order: str, issue: str, script: tuple[str, ...]
) -> SupportTask:
    data = Ticket(
        prompt=None,
        system_prompt=AGENT_PROMPT,
        customer=customer,
        order=order,
        issue=issue,
        script="\n".join(f"> {line}" for line in script),
    )
    return SupportTask(data, key=f"support-{index}")


class SupportDialogues(vf.Taskset[SupportTask]):
    """The built-in :data:`TICKETS`. ``user_model``/``judge_model`` (with ``*_base_url`` and
    ``*_api_key_var``) send the customer's or the judge's calls elsewhere than the agent's."""

    name = "support_dialogue"

    def __init__(
        self,
        user_model: str | None = None,
        user_base_url: str | None = None,
        user_api_key_var: str | None = None,
        judge_model: str | None = None,
        judge_base_url: str | None = None,
        judge_api_key_var: str | None = None,
    ) -> None:
        self.user = vf.ModelEndpoint(
            model=user_model, base_url=user_base_url, api_key_var=user_api_key_var
        )
        self.judge = vf.ModelEndpoint(
            model=judge_model, base_url=judge_base_url, api_key_var=judge_api_key_var
        )

    def load(self) -> Iterator[SupportTask]:
        # The class attributes are shared; other endpoints get a subclass of their own.
        task_type: type[SupportTask] = SupportTask
        if self.user != vf.ModelEndpoint() or self.judge != vf.ModelEndpoint():
            task_type = configured(self.user, self.judge)
        for index, ticket in enumerate(TICKETS):
            yield task_type(make_ticket(index, *ticket).data, key=f"support-{index}")


def configured(user: vf.ModelEndpoint, judge: vf.ModelEndpoint) -> type[SupportTask]:
    """SupportTask with its customer and judge sent to the given endpoints."""
    judge_copy = RubricJudge(
        SupportTask.service.criteria, view="replies", weight=0.5, endpoint=judge, name="service"
    )
    return type(
        "ConfiguredSupportTask",
        (SupportTask,),
        {
            "customer": vf.SimulatedUser(CUSTOMER_PROMPT, endpoint=user, name="customer"),
            "service": judge_copy,
            "__module__": __name__,
        },
    )
