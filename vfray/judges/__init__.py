"""Judges: rewards computed by a model. :class:`Judge` (a prompt template, a schema or parser,
retries, an endpoint that defaults to the rollout's), and the built-in :class:`ReferenceJudge`
and :class:`RubricJudge`.

Internal: importable, but not the public API (:mod:`vfray`, :mod:`vfray.testing`,
:mod:`vfray.train`, :mod:`vfray.compat.v1`); names here may move."""

from vfray.judges.base import Judge, JudgeResponse
from vfray.judges.reference import ReferenceJudge
from vfray.judges.rubric import Criterion, RubricJudge

__all__ = ["Criterion", "Judge", "JudgeResponse", "ReferenceJudge", "RubricJudge"]
