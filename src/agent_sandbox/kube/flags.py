"""Go `flag`-package compatible command-line parsing for the Go-compatible binaries (controller, router).

Owns the syntax upstream users already type (operations spec §7): `-flag`, `--flag`, `-flag=value`,
`--flag value` (non-boolean flags only), booleans as `-flag` / `-flag=false` (Go's ParseBool spellings),
durations in Go syntax ("5m", "1m30s", "250ms", "0"), integers with Go base prefixes, floats including
NaN/Inf. Parsing stops at "--" or the first non-flag argument (Go semantics: the rest are positional).

Errors mirror Go's wording and exit status: an unknown flag, a missing argument or an unparsable value
raises `FlagError` (the caller prints it with the usage and exits 2); `-h`/`-help` raises `HelpRequested`
(exit 0). Start-up validation of parsed values is not done here (see `options.validate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.meta import parse_duration
from ._logging import STACKTRACE_LEVELS, TIME_ENCODINGS, configure_logging, parse_zap_level

__all__ = [
    "ZAP_FLAGS",
    "Flag",
    "FlagError",
    "FlagSet",
    "HelpRequested",
    "configure_logging_from_flags",
    "format_duration",
    "parse_bool",
    "parse_duration",
]


class FlagError(ValueError):
    """The command line is malformed (Go: exit status 2)."""


class HelpRequested(Exception):
    """-h / -help / --help was given."""


def format_duration(seconds: float) -> str:
    """Render seconds the way Go prints a time.Duration default ("5m0s", "1m0s", "0s", "250ms")."""
    if seconds == 0:
        return "0s"
    if abs(seconds) < 1:
        return f"{seconds * 1000:g}ms"
    sign = "-" if seconds < 0 else ""
    rest = abs(seconds)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    out = f"{int(hours)}h" if hours else ""
    if hours or minutes:
        out += f"{int(minutes)}m"
    return f"{sign}{out}{secs:g}s"


def parse_bool(text: str) -> bool:
    """Go strconv.ParseBool."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"invalid boolean {text!r}")


def parse_int(text: str) -> int:
    """Go strconv.ParseInt(s, 0, 64): decimal, 0x/0o/0b prefixes, leading-0 octal, '_' after a prefix."""
    s = text.strip()
    neg = s.startswith("-")
    body = s.lstrip("+-")
    if len(body) > 1 and body[0] == "0" and body[1].isdigit():
        value = int(body, 8)
    elif "_" in body and body[:2].lower() not in ("0x", "0o", "0b"):
        raise ValueError(f"invalid integer {text!r}")
    else:
        value = int(body, 0)
    return -value if neg else value


def parse_float(text: str) -> float:
    """Go strconv.ParseFloat: also accepts NaN, Inf, +Inf, -Inf (any case)."""
    return float(text)


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag: name (without dashes), kind ('bool'/'int'/'float'/'string'/'duration'), default, usage."""

    name: str
    kind: str
    default: Any
    usage: str
    choices: tuple[str, ...] = ()
    check: Callable[[Any], object] | None = None
    """Extra value check; raising ValueError makes the value invalid (its message is shown)."""

    def parse(self, text: str) -> Any:
        parsers: dict[str, Callable[[str], Any]] = {
            "bool": parse_bool,
            "int": parse_int,
            "float": parse_float,
            "string": str,
            "duration": parse_duration,
        }
        value = parsers[self.kind](text)
        if self.choices and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}")
        if self.check is not None:
            self.check(value)
        return value

    def default_text(self) -> str:
        if self.kind == "duration":
            return format_duration(float(self.default))
        if self.kind == "bool":
            return "true" if self.default else "false"
        if self.kind == "float" and float(self.default).is_integer():
            return str(int(self.default))
        return str(self.default)


class FlagSet:
    """A set of flags parsed with Go semantics."""

    def __init__(self, program: str, flags: Sequence[Flag]) -> None:
        self.program = program
        self.flags = {f.name: f for f in flags}

    def usage(self) -> str:
        lines = [f"Usage of {self.program}:"]
        for name in sorted(self.flags):
            f = self.flags[name]
            type_hint = "" if f.kind == "bool" else f" {f.kind}"
            lines.append(f"  -{name}{type_hint}")
            default = f.default_text()
            suffix = (
                "" if (f.kind == "bool" and not f.default) or default == "" else f" (default {default!r})"
            )
            if f.kind in ("int", "float", "duration", "bool"):
                suffix = suffix.replace("'", "")
            lines.append(f"    \t{f.usage}{suffix}")
        return "\n".join(lines)

    def parse(self, args: Sequence[str]) -> tuple[dict[str, Any], set[str], list[str]]:
        """Parse `args`.

        Returns:
            (values for every flag, names explicitly set, positional arguments).

        Raises:
            FlagError: Go's "flag provided but not defined", "flag needs an argument", "invalid value".
            HelpRequested: -h/-help given.
        """
        values = {name: f.default for name, f in self.flags.items()}
        seen: set[str] = set()
        i = 0
        while i < len(args):
            arg = args[i]
            if len(arg) < 2 or arg[0] != "-":
                break
            if arg == "--":
                i += 1
                break
            body = arg[2:] if arg.startswith("--") else arg[1:]
            if not body or body[0] in "-=":
                raise FlagError(f"bad flag syntax: {arg}")
            name, has_value, value = body.partition("=")
            flag = self.flags.get(name)
            if flag is None:
                if name in ("h", "help"):
                    raise HelpRequested
                raise FlagError(f"flag provided but not defined: -{name}")
            if not has_value and flag.kind != "bool":
                if i + 1 >= len(args):
                    raise FlagError(f"flag needs an argument: -{name}")
                i += 1
                value = args[i]
            elif not has_value:
                value = "true"
            try:
                values[name] = flag.parse(value)
            except ValueError as exc:
                raise FlagError(f'invalid value "{value}" for flag -{name}: {_reason(exc)}') from exc
            seen.add(name)
            i += 1
        return values, seen, list(args[i:])


def _reason(exc: ValueError) -> str:
    # Go reports "parse error" for malformed numbers/bools/durations; our own checks explain themselves.
    text = str(exc)
    if text.startswith(("invalid ", "could not convert", "invalid literal")) and "level" not in text:
        return "parse error"
    return text


ZAP_FLAGS: tuple[Flag, ...] = (
    Flag(
        "zap-devel",
        "bool",
        False,
        "Development mode defaults (console encoder, debug level, warn stacktraces).",
    ),
    Flag("zap-encoder", "string", "", "Zap log encoding (one of 'json' or 'console')", ("json", "console")),
    Flag(
        "zap-log-level",
        "string",
        "",
        "Zap level: 'debug', 'info', 'error', 'panic' or an integer > 0.",
        check=parse_zap_level,
    ),
    Flag(
        "zap-stacktrace-level",
        "string",
        "",
        "Zap level at and above which stacktraces are captured.",
        STACKTRACE_LEVELS,
    ),
    Flag("zap-time-encoding", "string", "", "Zap time encoding.", TIME_ENCODINGS),
)
"""controller-runtime's zap logging flags (`configure_logging` consumes their values)."""


def configure_logging_from_flags(values: Any) -> None:
    """`configure_logging` from parsed zap flags (attributes `zap_devel`, `zap_encoder`, ...)."""
    configure_logging(
        devel=values.zap_devel,
        encoder=values.zap_encoder or None,
        level=values.zap_log_level or None,
        stacktrace_level=values.zap_stacktrace_level or None,
        time_encoding=values.zap_time_encoding or None,
    )
