"""``sessionfold demo``: a fleet of standing agents through the whole pipeline, and the report.

::

    report = run_demo(Settings(), DemoOptions(agents=2, turns=40, out=Path("out")), Console())

:mod:`.agents` (who runs), :mod:`.fleet` (each agent's thread and what it saw), :mod:`.report`
(the numbers), :mod:`.chart` (the PNG), :mod:`.live` (the progress view), :mod:`.runner` (the
whole run, on the pipeline :class:`~sessionfold.cli.stack.Stack` starts).
"""

from __future__ import annotations

from .agents import AgentScript, generated_fleet, transcript_fleet
from .chart import CHART_NAME
from .report import AgentReport, DemoReport
from .runner import REPORT_NAME, DemoOptions, describe_summarizer, run_demo

__all__ = [
    "CHART_NAME",
    "REPORT_NAME",
    "AgentReport",
    "AgentScript",
    "DemoOptions",
    "DemoReport",
    "describe_summarizer",
    "generated_fleet",
    "run_demo",
    "transcript_fleet",
]
