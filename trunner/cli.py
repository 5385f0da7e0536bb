"""The `trunner` command: run a mode, exec a program, or check this host.

Output is one JSON object on stdout. Bytes are base64 strings (msgspec's
JSON encoding) unless `--text` asks for UTF-8 text.

Exit codes, one convention:

- 0: the run gave its answer (`exec`: whatever the program's own exit);
- 1: a `RunnerError`: `{"error": REASON, "detail": ...}`;
- 2: a usage error: argparse's own (on stderr), or a value it could not
  check (`{"error": "usage", "detail": ...}` naming the flag);
- 128 + n: SIGTERM or SIGINT (n) cancelled the run, which cleaned up:
  `{"error": "signal", "detail": "cancelled by SIGTERM"}`.

`trunner exec --exit-code` exits with the program's own code instead (128 +
n when a signal n killed it, 127 not found, 126 cannot execute, as a shell),
and trunner's own failures then use the codes `timeout` uses: 124 the
wall-clock limit, 125 anything else trunner could not do (a usage error, any
other `RunnerError`). The JSON on stdout tells which: it has `"error"` only
when trunner failed.

Every `Limits` field has a flag with its unit in its name, generated from
the fields (`--wall-time-s`, `--memory-bytes`, ...). The older flags stay as
aliases: `--timeout` (`--wall-time-s`), `--cpu` (`--cpu-time-s`),
`--stdout-cap`, `--stderr-cap`, and `--memory`, which is
`--address-space-bytes` (RLIMIT_AS per process), not `--memory-bytes` (the
run's memory cgroup). Each takes its value with a unit (`trunner.units`):
`256M` (K, M, G binary, as Docker reads them; KB, MB, GB decimal), `500ms`,
`2s`, `1m`; a bare number is bytes or seconds, as the name says.

`exec --stdin TEXT` feeds TEXT; `--stdin -` this command's own stdin, and
`--stdin-file PATH` a file's bytes. A successful `exec` prints the
`ExecResult` without its `limit`, which is always None in a result.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec

from trunner import __version__
from trunner.units import FORMS, Unit, UnitError, parse_limit, unit_of

if TYPE_CHECKING:
    from collections.abc import Callable

#: Exit codes (see the module's docstring).
EXIT_ERROR = 1
EXIT_USAGE = 2
#: With `exec --exit-code`: trunner's own failures, as `timeout` answers.
EXIT_OWN_TIMEOUT = 124
EXIT_OWN_FAILURE = 125

#: Flags older than the generated ones, kept with their meaning.
LIMIT_ALIASES: dict[str, tuple[str, ...]] = {
    "wall_time_s": ("--timeout",),
    "stdout_max_bytes": ("--stdout-cap",),
    "stderr_max_bytes": ("--stderr-cap",),
    "cpu_time_s": ("--cpu",),
    "address_space_bytes": ("--memory",),
}


#: What each limit flag takes, by its unit (`trunner.units`).
_METAVAR: dict[Unit, str] = {Unit.BYTES: "SIZE", Unit.SECONDS: "TIME", Unit.COUNT: "N"}


class UsageError(Exception):
    """A value on the command line that cannot be used; names the flag."""


def limit_flag(field: str) -> str:
    """The generated flag of a `Limits` field: its name, dashed."""
    return "--" + field.replace("_", "-")


class _LimitAction(argparse.Action):
    """Records a Limits field's raw value and the flag it was given as."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:  # noqa: ANN401
        given: dict[str, tuple[str, str]] = getattr(namespace, "limit_flags", None) or {}
        given[self.dest] = (option_string or limit_flag(self.dest), values)
        namespace.limit_flags = given


def _limits_args(parser: argparse.ArgumentParser) -> None:
    from trunner.limits import Limits

    group = parser.add_argument_group(
        "limits (every field of trunner.Limits)",
        f"SIZE: {FORMS[Unit.BYTES]}; TIME: {FORMS[Unit.SECONDS]}. K, M and G are binary, as"
        " Docker reads them; a bare number keeps its unit: bytes, seconds.")
    defaults = Limits()
    for field in Limits.__struct_fields__:
        flags = (limit_flag(field), *(a for a in LIMIT_ALIASES.get(field, ())
                                      if a != limit_flag(field)))
        note = {"address_space_bytes": " (RLIMIT_AS per process; alias --memory), or 'auto'",
                "file_size_bytes": " (RLIMIT_FSIZE), or 'auto': the scratch's size + 64K",
                "memory_bytes": " (the run's memory cgroup, as root)"}.get(field, "")
        default = _default(field, getattr(defaults, field))
        group.add_argument(*flags, dest=field, action=_LimitAction,
                           metavar=_METAVAR[unit_of(field)], default=argparse.SUPPRESS,
                           help=f"Limits.{field}{note}; default {default}")


def _default(field: str, value: object) -> str:
    """A default as `--help` gives it: a round size with its suffix too."""
    if unit_of(field) is Unit.BYTES and isinstance(value, int) and value:
        for suffix, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if value % size == 0:
                return f"{value // size}{suffix} ({value})"
    return repr(value)


def _limits(args: argparse.Namespace) -> Any:  # noqa: ANN401
    """The Limits the flags give, each value read with its unit
    (`trunner.units`); a bad value is a `UsageError` naming the flag."""
    import re

    from trunner.limits import AUTO, Limits

    given: dict[str, tuple[str, str]] = getattr(args, "limit_flags", None) or {}
    values: dict[str, object] = {}
    for field, (typed, raw) in given.items():
        words = (AUTO,) if field in ("address_space_bytes", "file_size_bytes") else ()
        try:
            values[field] = parse_limit(field, raw, words=words)
        except UnitError as e:
            raise UsageError(f"{typed}: {e}") from None
    try:
        return Limits.from_mapping(values)
    except (msgspec.ValidationError, ValueError) as e:
        text = str(e)

        def flag(match: re.Match[str]) -> str:
            field = match.group(match.lastindex or 1)
            return given[field][0] if field in given else limit_flag(field)

        at = re.fullmatch(r"(.*) - at `\$\.(\w+)`", text, re.DOTALL)
        if at is not None:
            raise UsageError(f"{flag(at)}: {at.group(1)}") from None
        named = re.sub(r"`\$\.(\w+)`", lambda m: flag(m), text)
        if named == text:  # a rule over several fields (no path): name them all
            named = f"{text} (given: {', '.join(f for f, _ in given.values())})"
        raise UsageError(named) from None


def _print(obj: object) -> None:
    try:
        sys.stdout.buffer.write(msgspec.json.encode(obj) + b"\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `trunner exec ... | head`: the reader left, as is its right
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _Formatter(argparse.HelpFormatter):
    """Wraps a one-paragraph text; keeps one of several lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    """argparse, exiting `usage_exit` on an error (125 under `exec --exit-code`)."""

    def __init__(self, *args: Any, usage_exit: int = EXIT_USAGE,  # noqa: ANN401
                 epilog_of: Callable[[], str] | None = None, **kwargs: Any) -> None:  # noqa: ANN401
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.usage_exit = usage_exit
        self.epilog_of = epilog_of

    def format_help(self) -> str:
        if self.epilog_of is not None:  # worked out only when help is asked for
            self.epilog = self.epilog_of()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(self.usage_exit, f"{self.prog}: error: {message}\n")


#: What each built-in mode does (`trunner.kernel.abi.BUILTIN_MODES` names them).
BUILTIN_HELP: dict[str, str] = {
    "echo": "gives the request back as its response",
    "exec": "runs a program (an ExecRequest); 'trunner exec' is its command line",
    "files": "reads, writes, exports and imports the working dir's files (a FilesRequest)",
}


def _modes_help() -> str:
    """`run --help`'s list of modes: the built-in ones, those registered
    here (entry points in group `trunner.modes`), and the spec form."""
    from importlib.metadata import entry_points

    from trunner.kernel.abi import BUILTIN_MODES

    registered = {ep.name: ep.value for ep in entry_points(group="trunner.modes")}
    width = max(map(len, [*BUILTIN_MODES, *registered])) + 2
    lines = ["modes:", "  built in:"]
    lines += [f"    {name:<{width}}{BUILTIN_HELP.get(name, '')}".rstrip()
              for name in BUILTIN_MODES]
    lines.append("  registered (entry points in group 'trunner.modes'):")
    lines += [f"    {name:<{width}}{value}" for name, value in sorted(registered.items())]
    if not registered:
        lines.append("    (none here)")
    lines.append("  or PACKAGE.MODULE:FUNCTION, found on --import-path or in site-packages")
    return "\n".join(lines)


def _usage_exit(argv: list[str]) -> int:
    """The exit code of a usage error: 125 under `exec --exit-code`, else 2."""
    head = argv[: argv.index("--")] if "--" in argv else argv
    own_exit = bool(head) and head[0] == "exec" and "--exit-code" in head
    return EXIT_OWN_FAILURE if own_exit else EXIT_USAGE


def parse(argv: list[str]) -> argparse.Namespace:
    """What `argv` asks for, checked, without running anything: argparse's
    namespace, with `limits` (the `Limits` the flags give) for `run` and
    `exec`, and `env` (a dict, from the `--env` items) for `exec`.

    argparse's own errors exit as the command does (2; 125 under `exec
    --exit-code`); a value argparse cannot check raises a `UsageError`
    naming the flag as typed.
    """
    args = build_parser(_usage_exit(argv)).parse_args(argv)
    if args.command in ("run", "exec"):
        args.limits = _limits(args)
    if args.command == "exec":
        args.env = _read_env(args.env)
    return args


def build_parser(usage_exit: int = EXIT_USAGE) -> argparse.ArgumentParser:
    """The command's parser, each subcommand with its description and each
    flag with its help; argparse's errors exit `usage_exit`."""
    parser = _Parser(prog="trunner", description=__doc__, usage_exit=usage_exit)
    parser.add_argument("--version", action="version", version=f"trunner {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser(
        "run", usage_exit=usage_exit, help="run a worker mode on one request",
        description="Run MODE on one request in a fresh jail and print one JSON object:"
                    " {\"response\": ..., \"usage\": ..., \"rules_version\": ...}.",
        epilog_of=_modes_help)
    run.add_argument("mode", help="a built-in or registered mode, or PACKAGE.MODULE:FUNCTION"
                                  " (see 'modes' below)")
    run.add_argument("--request", default="null", metavar="JSON",
                     help="the request as JSON (default null), or - to read it from stdin")
    run.add_argument("--import-path", action="append", default=[], metavar="DIR",
                     help="a directory where PACKAGE.MODULE:FUNCTION modes are found, bound"
                          " read-only into the jail (repeatable)")
    _limits_args(run)
    ex = sub.add_parser(
        "exec", usage_exit=usage_exit, help="run a program inside the jail",
        description="Run ARGV (after --) inside a fresh jail, in its working dir, and print"
                    " how it ended as one JSON object: exit_code, signal, stdout, stderr"
                    " (base64, or text with --text), files, unmatched, elapsed_s, usage,"
                    " rules_version.")
    ex.add_argument("--text", action="store_true", help="print stdout/stderr as UTF-8 text")
    stdin = ex.add_mutually_exclusive_group()
    stdin.add_argument("--stdin", default="", metavar="TEXT",
                       help="TEXT (as UTF-8) is the program's stdin; '--stdin -' reads this"
                            " command's own stdin instead, as bytes (for a literal '-', use"
                            " --stdin-file)")
    stdin.add_argument("--stdin-file", metavar="PATH",
                       help="the bytes of the host file PATH are the program's stdin")
    ex.add_argument("--file", action="append", default=[], metavar="NAME=PATH",
                    help="place the host file PATH as NAME in the working dir (repeatable;"
                         " executable if PATH is)")
    ex.add_argument("--collect", action="append", default=[], metavar="GLOB",
                    help="return the files GLOB matches after the program exits (repeatable)")
    ex.add_argument("--out", metavar="DIR",
                    help="write collected files under DIR (with their permission bits)"
                         " instead of into the JSON")
    ex.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set NAME for the program (repeatable; over PATH, HOME, TMPDIR, LANG)")
    ex.add_argument("--capture-on-failure", action="store_true",
                    help="on a limit (timeout, cpu_time, memory_limit, a cap), print what the"
                         " program wrote before it under \"output\": a diagnostic")
    ex.add_argument("--exit-code", action="store_true",
                    help="exit with the program's own code; trunner's failures then exit 124"
                         " (wall-clock limit) or 125")
    _limits_args(ex)
    ex.add_argument("argv", nargs="+", metavar="ARGV",
                    help="the program (found on the jail's PATH) and its arguments")
    doctor = sub.add_parser(
        "doctor", usage_exit=usage_exit, help="what this host supports; exit 0 if a run would work",
        description="Check what this host supports, layer by layer, and whether a run would"
                    " work: exit 0 if it would, 1 if not (the refusal names the fix).")
    doctor.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
        if args.command == "doctor":
            return _doctor(args.json)
        import trio

        return trio.run(_run, args)
    except UsageError as e:
        _print({"error": "usage", "detail": str(e)})
        print(f"trunner: error: {e}", file=sys.stderr)
        return _usage_exit(argv)


async def _run(args: argparse.Namespace) -> int:
    from trunner.signals import cancel_on_signals

    async with cancel_on_signals() as stop:
        return await _run_command(args)
    # Reached only when a signal cancelled the body.
    assert stop.signal is not None
    assert stop.exit_code is not None
    _print({"error": "signal", "detail": f"cancelled by {stop.signal.name}"})
    return stop.exit_code


async def _run_command(args: argparse.Namespace) -> int:
    from trunner.errors import Reason, RunnerError
    from trunner.runner import Runner

    limits = args.limits
    own_exit = getattr(args, "exit_code", False)
    try:
        if args.command == "run":
            try:
                runner = Runner(limits=limits, import_paths=args.import_path)
            except ValueError as e:  # an import path that is not a directory
                raise UsageError(f"--import-path: {e}") from None
            text = await _read_stdin("--request -") if args.request == "-" else args.request
            try:
                request = msgspec.json.decode(text)
            except msgspec.DecodeError as e:
                raise UsageError(f"--request: not JSON: {e}") from None
            result: Any = await runner.run(args.mode, request)
            _print({"response": result.response, "usage": result.usage,
                    "rules_version": result.rules_version})
            return 0
        files = _read_files(args.file)
        if args.stdin_file is not None:
            stdin = await _read_stdin_file(args.stdin_file)
        elif args.stdin == "-":
            from trunner.protocol import EXEC_INPUT_MAX_BYTES

            stdin = await _read_stdin("--stdin -", EXEC_INPUT_MAX_BYTES)
        else:
            stdin = args.stdin.encode()
        runner = Runner(limits=limits)
        res = await runner.exec(args.argv, stdin=stdin, files=files,
                                collect=args.collect, env=args.env,
                                capture_on_failure=args.capture_on_failure)
        out: dict[str, object] = msgspec.structs.asdict(res.response)
        # Always None in a result: the adapter's report of a limit it hit,
        # which the parent turns into a RunnerError, never into a result.
        del out["limit"]
        if args.out is not None:
            out["files"] = _write_files(args.out, res.response.files)
        if args.text:
            out["stdout"] = res.response.stdout.decode(errors="replace")
            out["stderr"] = res.response.stderr.decode(errors="replace")
        out["rules_version"] = res.rules_version
        _print(out)
        if own_exit:
            done = res.response
            return done.exit_code if done.exit_code is not None else 128 + (done.signal or 0)
        return 0
    except RunnerError as e:
        failed: dict[str, object] = {"error": e.reason.value, "detail": e.detail}
        if e.usage is not None:  # the program ran: what it used up to the failure
            failed["usage"] = e.usage
        if e.output is not None:  # --capture-on-failure: what it wrote before it
            output: dict[str, object] = msgspec.structs.asdict(e.output)
            if getattr(args, "text", False):
                output["stdout"] = e.output.stdout.decode(errors="replace")
                output["stderr"] = e.output.stderr.decode(errors="replace")
            failed["output"] = output
        _print(failed)
        if own_exit:
            return EXIT_OWN_TIMEOUT if e.reason is Reason.TIMEOUT else EXIT_OWN_FAILURE
        return EXIT_ERROR


async def _read_stdin(flag: str, max_bytes: int = -1) -> bytes:
    """This command's own stdin, whole, as bytes; over `max_bytes` (when
    given) is a `UsageError` naming `flag`."""
    data = await _in_thread(_read_fd, sys.stdin.fileno(), max_bytes)
    if 0 <= max_bytes < len(data):
        raise UsageError(f"{flag}: stdin is over {max_bytes} bytes, the most exec takes")
    return data


async def _read_stdin_file(path: str) -> bytes:
    """`--stdin-file PATH`: the file's bytes (a `UsageError` names the flag)."""
    import os

    from trunner.protocol import EXEC_INPUT_MAX_BYTES

    def read() -> bytes:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _read_fd(fd, EXEC_INPUT_MAX_BYTES)
        finally:
            os.close(fd)

    try:
        data = await _in_thread(read)
    except OSError as e:
        raise UsageError(f"--stdin-file {path!r}: {e.strerror}") from None
    if len(data) > EXEC_INPUT_MAX_BYTES:
        raise UsageError(f"--stdin-file {path!r}: over {EXEC_INPUT_MAX_BYTES} bytes, the most"
                         " exec takes")
    return data


async def _in_thread(fn: Callable[..., bytes], *args: int) -> bytes:
    """`fn(*args)` in a thread that a signal's cancellation abandons, so
    SIGTERM or SIGINT ends a command still reading a pipe or a FIFO."""
    import trio

    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


def _read_fd(fd: int, max_bytes: int = -1) -> bytes:
    """`fd` to its end, or to one byte past `max_bytes` (when given).

    Raw reads, never `sys.stdin.buffer`: a thread abandoned in a read
    holds no lock the interpreter's exit then waits on (it aborts, "could
    not acquire lock for <stdin>", if a thread holds stdin's)."""
    import os

    data = bytearray()
    while max_bytes < 0 or len(data) <= max_bytes:
        want = 1 << 16 if max_bytes < 0 else min(1 << 16, max_bytes + 1 - len(data))
        chunk = os.read(fd, want)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _read_env(specs: list[str]) -> dict[str, str]:
    """`--env NAME=VALUE` items (the value may hold `=`; the last one given wins)."""
    env: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name:
            raise UsageError(f"--env {spec!r}: expected NAME=VALUE")
        env[name] = value
    return env


def _read_files(specs: list[str]) -> dict[str, Any]:
    """`--file NAME=PATH` items as `Runner.exec` files (a `UsageError` names the flag)."""
    import os

    from trunner.protocol import ExecFile

    files: dict[str, Any] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--file {spec!r}: expected NAME=PATH")
        try:
            with open(path, "rb") as f:
                data = f.read()
                executable = bool(os.fstat(f.fileno()).st_mode & 0o111)
        except OSError as e:
            raise UsageError(f"--file {spec!r}: {e.strerror}") from None
        if name in files:
            raise UsageError(f"--file {name!r} is given twice")
        files[name] = ExecFile(data=data, executable=executable)
    return files


def _write_files(out_dir: str, files: list[Any]) -> list[dict[str, object]]:
    """Write collected files under `out_dir`, opened once: each path (a
    checked relative one) is walked one component at a time from it, never
    following a symlink (`O_NOFOLLOW`: a link planted in `out_dir` fails
    the write, ELOOP, and the file it names is untouched)."""
    import contextlib
    import os

    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        os.makedirs(out_dir, exist_ok=True)
        top = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"--out {out_dir!r}: {e.strerror}") from None
    listed: list[dict[str, object]] = []
    try:
        for file in files:
            *parents, name = file.path.split("/")
            dir_fd = os.dup(top)
            try:
                for part in parents:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=dir_fd)
                    fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=dir_fd)
                    os.close(dir_fd)
                    dir_fd = fd
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nofollow, 0o600,
                             dir_fd=dir_fd)
                with open(fd, "wb") as f:
                    # The jail's permission bits, on the fd (never a link),
                    # without setuid, setgid or sticky.
                    os.fchmod(f.fileno(), file.mode & 0o777)
                    f.write(file.data)
            except OSError as e:
                raise UsageError(f"--out {out_dir!r}: {file.path}: {e.strerror}") from None
            finally:
                os.close(dir_fd)
            listed.append({"path": file.path, "size": file.size, "mode": file.mode,
                           "written": os.path.join(out_dir, file.path)})
    finally:
        os.close(top)
    return listed


def _doctor(as_json: bool) -> int:
    import dataclasses

    from trunner.errors import RunnerError
    from trunner.runner import Runner

    try:
        runner = Runner()
        host = runner.backend.probe()
        report: dict[str, object] = dataclasses.asdict(host)
        report["rules_version"] = runner.rules_version()
        report["worker"] = runner.worker
    except RunnerError as e:
        report = {"refusal": e.reason.value, "refusal_detail": e.detail}
    ok = report.get("refusal") is None
    report["can_run"] = ok
    from trunner.backend import host_report

    report.update(host_report())
    layers: dict[str, dict[str, Any]] = report.get("layers") or {}  # type: ignore[assignment]
    if as_json:
        _print(report)
    else:
        for key, value in report.items():
            if key not in ("layers", "memory_bounds"):
                text = _plain(value)
                if text:  # an empty field is left out, not printed empty
                    print(f"{key:>20}: {text}")
        if layers:
            print(f"{'layers':>20}: what holds on this host")
        for name, layer in layers.items():
            print(f"{name:>20}: {_layer_text(name, layer)}")
        bounds = report.get("memory_bounds") or []
        if bounds:
            print(f"{'memory bounds':>20}: what bounds a run's memory (default Limits), layer"
                  " by layer")
        for bound in bounds:  # type: ignore[attr-defined]
            print(f"{bound['what']:>20}: {bound['bound']}")
    return 0 if ok else 1


def _plain(value: object) -> str:
    """A report value in words: no Python reprs ('' for an empty one)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(t for t in map(_plain, value) if t)
    if isinstance(value, dict):
        if set(value) >= {"kind", "cgroup_base"}:  # a ProcessLimit
            where = f" under {value['cgroup_base']}" if value["cgroup_base"] else ""
            return f"{value['kind']}{where}"
        return ", ".join(f"{k} {t}" for k, v in value.items() if (t := _plain(v)))
    return str(value)


def _layer_text(name: str, layer: dict[str, Any]) -> str:
    """One layer of `doctor`, in words (more lines for what another layer covers)."""
    state = "holds" if layer["holds"] else "DOES NOT HOLD"
    if name == "namespaces":
        missing = f"; disabled: {', '.join(layer['missing'])}" if layer["missing"] else ""
        return f"{state}: {', '.join(layer['available'])}{missing}"
    if name == "landlock":
        has = [f for f, on in layer["features"].items() if on]
        lines = [f"{state}: ABI {layer['abi_used']} in use (kernel {layer['kernel_abi']},"
                 f" known up to {layer['known_abi']}): {', '.join(has) or 'nothing'}"]
        lines += [f"{'':>22}without {f}: {covered}"
                  for f, covered in layer["covered_by_other_layers"].items()]
        return "\n".join(lines)
    if name == "process_limit":
        note = f"\n{'':>22}cgroups: {layer['cgroup_note']}" if layer.get("cgroup_note") else ""
        if not layer["holds"]:
            return f"{state}: no pids cgroup for the runs{note}"
        where = f" under {layer['cgroup_base']}" if layer["cgroup_base"] else ""
        per_run = ", per run" if layer["per_run"] else ", per uid (kernel before 5.14)"
        return f"{state}: {layer['kind']}{where}{per_run}{note}"
    if name == "seccomp":
        return state if layer["holds"] else f"{state}: {layer['detail']}"
    if name in ("memory", "identity", "cgroup_view"):
        return f"{state}: {layer['detail']}"
    if name == "provider_profile":
        return "can run" if layer["holds"] else f"refused: {layer['detail']}"
    return state


if __name__ == "__main__":
    sys.exit(main())
