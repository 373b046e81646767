"""Who may make a model call, and why one is refused: the rollout's secret, its stop checks.

:func:`authenticate` finds the session a request's API key opens; :func:`refusal` says why a
session's next call must not be forwarded (a stop already set, a limit reached, the stop hook);
:func:`refused` answers a :class:`~vfray.interception._incoming.RequestError` in a dialect's
error shape, and :func:`note_refusal` notes a client-input refusal on the trace.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from vfray.errors import TaskError
from vfray.interception._incoming import ErrorResponse, Incoming, RequestError
from vfray.interception.dialects import Dialect
from vfray.interception.sessions import Session, SessionRegistry
from vfray.trace import StopCondition

_MAX_SECRET_CHARS = 256
_NOTED_REFUSALS = 5
"""Client-input refusals noted on one trace (a client may retry a bad request for minutes)."""


def _secret(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    # Gemini's SDK sends its key as x-goog-api-key (its REST API also takes ?key=).
    return (
        request.headers.get("x-api-key")
        or request.headers.get("x-goog-api-key")
        or request.query_params.get("key")
        or None
    )


def authenticate(sessions: SessionRegistry, request: Request) -> Session:
    """The live session whose secret ``request`` carries; a 401 or a final 409 otherwise."""
    secret = _secret(request)
    if secret is None:
        raise RequestError(401, "missing API key (Authorization: Bearer, or x-api-key)")
    if len(secret) <= _MAX_SECRET_CHARS:
        session = sessions.lookup(secret)
        if session is not None:
            return session
        if sessions.was_concluded(secret):
            raise RequestError(
                409, "this rollout has concluded; no more calls are accepted", final=True
            )
    raise RequestError(401, "unknown API key", final=True)


async def refusal(session: Session) -> str | None:
    """Why the next call must not be forwarded (a limit or a stop hook), or None."""
    trace = session.trace
    if trace.stop_condition is not None:
        return trace.stop_condition.value
    reached = session.limits.reached(trace)
    if reached is not None:
        trace.stop(reached)
        return reached.value
    if session.stop_check is None:
        return None
    try:
        hook = await session.stop_check(trace)
    except Exception as exc:
        trace.add_error(TaskError(f"stop hook failed: {type(exc).__name__}: {exc}"), "agent")
        trace.stop(StopCondition.ERROR)
        return StopCondition.ERROR.value
    if hook is None:
        return None
    trace.stop(StopCondition.STOP_HOOK)
    trace.notes.append(f"stop hook {hook!r} ended the rollout")
    return f"{StopCondition.STOP_HOOK.value} ({hook})"


def refused(dialect: Dialect, exc: RequestError, incoming: Incoming) -> Response:
    """``exc`` in ``dialect``'s error shape; a final refusal in its final status, marked so."""
    status = dialect.final_status if exc.final else exc.status
    answer = ErrorResponse(dialect.error_body(status, str(exc)), status, incoming)
    if exc.final:
        answer.headers["x-should-retry"] = "false"
    return answer


def note_refusal(session: Session, status: int, message: str) -> None:
    """Say on the trace that the agent's request was refused as bad input (the harness's own
    error, if it gives up, follows; the first few refusals are enough to see why)."""
    if session.concluded:
        return  # its trace has been handed over
    session.refusals += 1
    if session.refusals <= _NOTED_REFUSALS:
        note = f"interception refused a call as bad input: HTTP {status}: {message[:500]}"
        session.trace.notes.append(note)
    elif session.refusals == _NOTED_REFUSALS + 1:
        session.trace.notes.append("interception refused further calls as bad input (not noted)")
