"""Who the demo's fleet is: generated operations agents, or the user's own session files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sessionfold.cli.files import load_conversation_file
from sessionfold.core.errors import InvalidInputError
from sessionfold.core.messages import Conversation

from ..standin.opsagent import LateQuestion, generate_session

__all__ = ["AgentScript", "generated_fleet", "transcript_fleet"]


@dataclass(frozen=True)
class AgentScript:
    """One standing agent's whole run, and the late questions it will be asked.

    ``source`` says where the conversation came from (``generated`` or a file name).
    """

    name: str
    conversation: Conversation
    source: str
    late_questions: tuple[LateQuestion, ...] = ()

    @property
    def model_calls(self) -> int:
        """Calls the agent makes: one before each assistant message but a leading one."""
        return sum(1 for i, m in enumerate(self.conversation.messages)
                   if m.role == "assistant" and i > 0)


def generated_fleet(agents: int, turns: int, *, seed: int = 7) -> list[AgentScript]:
    """``agents`` on-call operations agents of ``turns`` tool steps each (deterministic)."""
    if agents < 1:
        raise InvalidInputError(f"--agents must be at least 1, got {agents}")
    if turns < 10:
        raise InvalidInputError(f"--turns must be at least 10, got {turns}")
    fleet = []
    for n in range(agents):
        session = generate_session(n, turns, seed)
        fleet.append(AgentScript(session.name, session.conversation, "generated",
                                 tuple(session.late_questions)))
    return fleet


def transcript_fleet(directory: Path, limit: int | None = None) -> list[AgentScript]:
    """One agent per ``*.json`` session file in ``directory`` (sorted by name, at most ``limit``).

    Raises InvalidInputError for a missing folder, a folder without session files, or a file
    that is not a session (the message names the file).
    """
    if not directory.is_dir():
        raise InvalidInputError(f"--transcripts: {directory} is not a folder")
    files = sorted(directory.glob("*.json"))
    if limit is not None:
        files = files[:limit]
    if not files:
        raise InvalidInputError(f"--transcripts: no *.json session files in {directory}")
    fleet = []
    for path in files:
        try:
            conversation = load_conversation_file(path)
        except InvalidInputError as exc:
            raise InvalidInputError(f"--transcripts: {path.name}: {exc}") from None
        fleet.append(AgentScript(path.stem, conversation, path.name))
    return fleet
