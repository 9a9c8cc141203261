"""Help text a person can read: no ``<bool>``/``<str>`` type tags, no ``{job_id}`` braces.

Recent typer versions print each option's Python type in angle brackets and each required
argument in braces. ``PlainGroup`` (the ``framefleet`` command's class) renders them the way
command-line tools usually do instead: ``--timeout SECONDS``, flags without a type, arguments
by their upper-case name (``JOB_ID``). It converts every command and group below it when they
are looked up, so sub-apps (``framefleet cost``) get the same help without knowing of it.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

#: How a type without a metavar is shown.
_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "bool": ""}


class PlainOption(TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        if self.metavar is not None:
            return self.metavar
        if self.is_flag:
            return None
        label = str(super().display_type_rich(ctx) or "").strip("<>")
        return _TYPES.get(label.lower(), label.upper()) or None


class PlainArgument(TyperArgument):
    @property
    def display_name_raw(self) -> str:
        return self.metavar or str(self.name).upper()

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def _plain_params(params: list[Any]) -> list[Any]:
    for p in params:
        if type(p) is TyperOption:
            p.__class__ = PlainOption
        elif type(p) is TyperArgument:
            p.__class__ = PlainArgument
    return params


class PlainCommand(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_params(super().get_params(ctx))


class PlainGroup(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_params(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if type(cmd) is TyperCommand:
            cmd.__class__ = PlainCommand
        elif type(cmd) is TyperGroup:
            cmd.__class__ = PlainGroup
        return cmd


def plain_typer(**kwargs: Any) -> typer.Typer:
    """A ``typer.Typer`` whose help reads as above."""
    return typer.Typer(cls=PlainGroup, **kwargs)
