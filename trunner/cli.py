"""The `trunner` command: run a mode, exec a program, or check this host.

Output is one JSON object on stdout. Bytes are base64 strings (msgspec's
JSON encoding) unless `--text` asks for UTF-8 text. On a `RunnerError` it
prints `{"error": REASON, "detail": ...}` and exits 1. SIGTERM or SIGINT
cancels the run, which cleans up; it then prints `{"error": "signal", ...}`
and exits 128 + the signal.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec


def _limits_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, help="wall-clock limit, seconds")
    parser.add_argument("--stdout-cap", type=int, help="stdout cap, bytes")
    parser.add_argument("--stderr-cap", type=int, help="stderr cap, bytes")
    parser.add_argument("--cpu", type=int, help="CPU time limit, seconds")
    parser.add_argument("--memory", type=_bytes_or_auto,
                        help="address-space limit (RLIMIT_AS), bytes, or 'auto' (the default:"
                             " none where the run has a memory cgroup, else 1 GiB)")
    parser.add_argument("--processes", type=int, help="process limit")


def _bytes_or_auto(text: str) -> int | str:
    return text if text == "auto" else int(text)


def _limits(args: argparse.Namespace) -> Any:  # noqa: ANN401
    from trunner.limits import Limits

    changes = {
        name: value
        for name, value in (
            ("wall_time_s", args.timeout),
            ("stdout_max_bytes", args.stdout_cap),
            ("stderr_max_bytes", args.stderr_cap),
            ("cpu_time_s", args.cpu),
            ("address_space_bytes", args.memory),
            ("processes", args.processes),
        )
        if value is not None
    }
    return Limits.from_mapping(changes)


def _print(obj: object) -> None:
    sys.stdout.buffer.write(msgspec.json.encode(obj) + b"\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trunner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a worker mode on one request")
    run.add_argument("mode")
    run.add_argument("--request", default="null", help="the request as JSON, or - for stdin")
    run.add_argument("--import-path", action="append", default=[], help="where user modes live")
    _limits_args(run)
    ex = sub.add_parser("exec", help="run a program inside the jail")
    ex.add_argument("--text", action="store_true", help="print stdout/stderr as UTF-8 text")
    ex.add_argument("--stdin", default="", help="text fed to the program's stdin")
    ex.add_argument("--file", action="append", default=[], metavar="NAME=PATH",
                    help="place the host file PATH as NAME in the working dir (repeatable;"
                         " executable if PATH is)")
    ex.add_argument("--collect", action="append", default=[], metavar="GLOB",
                    help="return the files GLOB matches after the program exits (repeatable)")
    ex.add_argument("--out", metavar="DIR",
                    help="write collected files under DIR instead of into the JSON")
    _limits_args(ex)
    ex.add_argument("argv", nargs="+")
    doctor = sub.add_parser("doctor", help="what this host supports; exit 0 if a run would work")
    doctor.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return _doctor(args.json)
    import trio

    try:
        return trio.run(_run, args)
    except ValueError as e:  # bad limits or request
        _print({"error": "bad_request", "detail": str(e)})
        return 2


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
    from trunner.errors import RunnerError
    from trunner.runner import Runner

    limits = _limits(args)
    try:
        if args.command == "run":
            runner = Runner(limits=limits, import_paths=args.import_path)
            text = sys.stdin.read() if args.request == "-" else args.request
            result: Any = await runner.run(args.mode, msgspec.json.decode(text))
            _print({"response": result.response, "rules_version": result.rules_version})
        else:
            runner = Runner(limits=limits)
            res = await runner.exec(args.argv, stdin=args.stdin.encode(),
                                    files=_read_files(args.file), collect=args.collect)
            out: dict[str, object] = msgspec.structs.asdict(res.response)
            if args.out is not None:
                out["files"] = _write_files(args.out, res.response.files)
            if args.text:
                out["stdout"] = res.response.stdout.decode(errors="replace")
                out["stderr"] = res.response.stderr.decode(errors="replace")
            out["rules_version"] = res.rules_version
            _print(out)
    except RunnerError as e:
        _print({"error": e.reason.value, "detail": e.detail})
        return 1
    return 0


def _read_files(specs: list[str]) -> dict[str, Any]:
    """`--file NAME=PATH` items as `Runner.exec` files (ValueError: bad_request)."""
    import os

    from trunner.protocol import ExecFile

    files: dict[str, Any] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--file {spec!r}: expected NAME=PATH")
        try:
            with open(path, "rb") as f:
                data = f.read()
                executable = bool(os.fstat(f.fileno()).st_mode & 0o111)
        except OSError as e:
            raise ValueError(f"--file {spec!r}: {e.strerror}") from None
        if name in files:
            raise ValueError(f"--file {name!r} is given twice")
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
        raise ValueError(f"--out {out_dir!r}: {e.strerror}") from None
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
                raise ValueError(f"--out {out_dir!r}: {file.path}: {e.strerror}") from None
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
                print(f"{key:>20}: {value}")
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
        where = f" under {layer['cgroup_base']}" if layer["cgroup_base"] else ""
        per_run = ", per run" if layer["per_run"] else ", per uid (kernel before 5.14)"
        return f"{state}: {layer['kind']}{where}{per_run}"
    if name in ("memory", "identity"):
        return f"{state}: {layer['detail']}"
    if name == "provider_profile":
        return "can run" if layer["holds"] else f"refused: {layer['detail']}"
    return state


if __name__ == "__main__":
    sys.exit(main())
