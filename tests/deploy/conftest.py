"""Fixtures of the deployment tests.

The deploy files (``deploy/Dockerfile``, ``docker-compose.yml``, ``deploy/k8s``,
``deploy/prometheus``, ``deploy/grafana``) name commands, environment variables, ports and metrics
of the package. These fixtures expose what the package really offers, so each test can hold the
files to it:

- ``parse_cli(argv)``: parses argv with the real ``sessionfold`` parser
  (:func:`sessionfold.cli.main.build_parser`); fails when the subcommand is not registered.
- ``settings_env_names``: every environment variable :class:`~sessionfold.runtime.settings.Settings`
  reads.
- ``settings_from_env(env)``: builds ``Settings`` from exactly ``env`` (nothing inherited from the
  test process), so a test sees whether a container's environment is accepted.
- ``dockerfile``: ``deploy/Dockerfile`` parsed into stages of instructions (:class:`Dockerfile`).
- ``promtool``: the path of Prometheus' ``promtool``; skips without it, fails without it under CI.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def cli_parser() -> argparse.ArgumentParser:
    from sessionfold.cli.main import build_parser

    return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the sessionfold parser has no subcommands")


@pytest.fixture(scope="session")
def registered_subcommands(cli_parser: argparse.ArgumentParser) -> frozenset[str]:
    """The subcommands ``sessionfold`` has now."""
    return frozenset(_subcommands(cli_parser))


@pytest.fixture(scope="session")
def parse_cli(cli_parser: argparse.ArgumentParser,
              registered_subcommands: frozenset[str]) -> Callable[[list[str]], argparse.Namespace]:
    """Parse ``sessionfold ARGV`` as the image's entrypoint would, without running it."""

    def parse(argv: list[str]) -> argparse.Namespace:
        assert argv, "an empty command runs the image's default (--help), not a role"
        # A deploy file that starts a role the command lacks is a container that cannot start.
        assert argv[0] in registered_subcommands, (
            f"`sessionfold {argv[0]}` is no subcommand "
            f"(registered: {', '.join(sorted(registered_subcommands))})")
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                return cli_parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"`sessionfold {' '.join(argv)}` is rejected (exit {exc.code}): "
                        f"{err.getvalue().strip()}")

    return parse


def _settings_class() -> Any:
    try:
        from sessionfold.runtime import settings
    except ModuleNotFoundError as exc:
        if exc.name == "sessionfold.runtime.settings":
            pytest.skip("sessionfold.runtime.settings is not written yet")
        raise
    return settings.Settings


@pytest.fixture(scope="session")
def settings_env_names() -> frozenset[str]:
    """Upper-cased names of every environment variable ``Settings`` reads.

    Computed the way pydantic-settings reads them: a field's validation alias (each choice of
    an ``AliasChoices``) is its variable, unprefixed; any other field is ``env_prefix + name``.
    """
    from pydantic import AliasChoices

    cls = _settings_class()
    prefix = str(cls.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for name, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, str):
            names.add(alias.upper())
        elif isinstance(alias, AliasChoices):
            names.update(c.upper() for c in alias.choices if isinstance(c, str))
        else:
            names.add((prefix + (info.alias or name)).upper())
    return frozenset(names)


@pytest.fixture
def settings_from_env(monkeypatch: pytest.MonkeyPatch,
                      settings_env_names: frozenset[str]) -> Callable[[Mapping[str, str]], Any]:
    """Build ``Settings()`` with ``env`` as the only settings variables in the environment."""
    cls = _settings_class()

    def build(env: Mapping[str, str]) -> Any:
        for name in list(os.environ):
            if name.upper() in settings_env_names or name.upper().startswith("SESSIONFOLD_"):
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return cls()

    return build


@pytest.fixture(scope="session")
def promtool() -> Iterator[str]:
    """Prometheus' promtool (Debian: ``apt-get install prometheus``)."""
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run must `apt-get install -y prometheus`")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    yield path


# --- deploy/Dockerfile -------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: ``RUN --mount=... python -m venv ...``."""

    keyword: str  # upper-cased: RUN, COPY, ENV ...
    value: str  # the rest, continuation lines joined with a space
    line: int  # 1-based line where it starts

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction, None for the shell form."""
        text = _strip_flags(self.value)
        if not text.startswith("["):
            return None
        parsed = json.loads(text)
        assert isinstance(parsed, list) and all(isinstance(x, str) for x in parsed), self
        return parsed

    def flags(self) -> dict[str, str]:
        """``--name=value`` flags before the arguments (``COPY --from=build``)."""
        found: dict[str, str] = {}
        for token in shlex.split(self.value):
            if not token.startswith("--"):
                break
            name, _, val = token[2:].partition("=")
            found[name] = val
        return found


def _strip_flags(value: str) -> str:
    return re.sub(r"^(?:--\S+\s+)*", "", value.strip())


@dataclass
class Stage:
    """The instructions from one FROM to the next."""

    base: str  # the FROM image, global ARG defaults substituted
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """Variables the stage's ENV instructions set, in order (later ones win)."""
        env: dict[str, str] = {}
        for ins in self.all("ENV"):
            for token in shlex.split(ins.value):
                key, sep, val = token.partition("=")
                assert sep, f"line {ins.line}: write ENV as KEY=value ({token!r})"
                env[key] = val
        return env


@dataclass
class Dockerfile:
    path: Path
    directives: dict[str, str]
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def parse_dockerfile(path: Path) -> Dockerfile:
    """A small Dockerfile parser: parser directives, line continuations, comments, stages."""
    lines = path.read_text().splitlines()
    directives: dict[str, str] = {}
    for raw in lines:
        found = re.match(r"^#\s*([a-z]+)\s*=\s*(\S+)\s*$", raw)
        if not found:
            break
        directives[found.group(1)] = found.group(2)
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if text.startswith("#") or (not text and not pending):
            continue  # comments may sit inside a continued instruction too
        if not pending:
            start = number
        continued = text.endswith("\\")
        pending.append(text[:-1].strip() if continued else text)
        if not continued:
            joined = " ".join(p for p in pending if p)
            keyword, _, value = joined.partition(" ")
            instructions.append(Instruction(keyword.upper(), value.strip(), start))
            pending = []
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = _strip_flags(ins.value).split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), ""), words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert ins.keyword == "ARG", f"line {ins.line}: only ARG may come before FROM"
            key, _, default = ins.value.partition("=")
            global_args[key.strip()] = default.strip()
        else:
            stages[-1].instructions.append(ins)
    assert stages, f"{path}: no FROM"
    return Dockerfile(path, directives, global_args, stages)


@pytest.fixture(scope="session")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(REPO / "deploy" / "Dockerfile")
