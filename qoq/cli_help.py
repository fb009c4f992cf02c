"""Conventional help text and usage errors for the `qoq` command. Typer 0.29 prints `<bool>` after
every flag, `<str>` after every value and `{name}` for required arguments; this restores the usual
forms (`--json`, `--windows N`, `eval TASK MODEL`). A usage error (missing option, bad value) is one
`error:` line like every other error, not a boxed panel (exit code 2, click's). Importing the module
applies both."""

from __future__ import annotations

import sys

from typer import core, rich_utils

_ARG_TYPES = {"<str>", "<path>"}


def _option_type(self, ctx):
    if self.metavar is not None:
        return self.metavar
    if self.is_flag or self.count:
        return None
    return self.display_type(ctx).strip("<>").upper()


def _argument_type(self, ctx):
    shown = self.display_type(ctx)
    return None if shown in _ARG_TYPES else shown.strip("<>").upper()


def _argument_usage(self):
    name = self.display_name_raw.upper()
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


def _argument_name(self):
    return self.display_name_raw.upper() + ("..." if self.metavar is None and self.nargs != 1 else "")


core.TyperOption.display_type_rich = _option_type
core.TyperArgument.display_type_rich = _argument_type
core.TyperArgument._usage_display_name = _argument_usage
core.TyperArgument._rich_display_name = _argument_name


def _one_line_usage_error(e) -> None:
    if type(e).__name__ == "NoArgsIsHelpError":  # the help was printed: nothing to add
        return
    ctx = getattr(e, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    print(f"error: {' '.join(e.format_message().split())}{hint}", file=sys.stderr)


rich_utils.rich_format_error = _one_line_usage_error
