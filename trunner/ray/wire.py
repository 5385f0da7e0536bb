"""What crosses between the driver and a node's actor: msgpack bytes of
trunner's own structs, never cloudpickle.

Sans-IO: imports neither ray nor trio. A call is one `RunCall` or one
`ExecCall` (a tagged union: the tag says which, never which fields are
set), each with the call's own `limits` or None for the pool's (a call
from before them, without the field, decodes as the pool's); its answer
is one `Success` (the response kept as raw msgpack,
decoded on the driver with the caller's `response_type`) or one `Failure`
(a `RunnerError`, field for field). Tags are explicit, so renaming a class
cannot change the wire.
"""

from typing import Any

import msgspec

from trunner.errors import Reason, RunnerError
from trunner.limits import Limits
from trunner.output import CapturedOutput
from trunner.protocol import ExecFile, Usage

_NIL = msgspec.Raw(b"\xc0")  # msgpack nil


class RunCall(msgspec.Struct, tag="run", frozen=True, kw_only=True):
    """`pool.run(request)` of the pool's mode: the request as msgpack (`raw`)."""

    id: str
    request: msgspec.Raw = _NIL
    #: The call's own limits (`pool.run(..., limits=)`); None: the pool's.
    limits: Limits | None = None


class ExecCall(msgspec.Struct, tag="exec", frozen=True, kw_only=True):
    """`pool.exec(argv, ...)`, checked on the driver as `Runner.exec` checks it."""

    id: str
    argv: list[str]
    stdin: bytes = b""
    files: dict[str, ExecFile] = {}
    collect: list[str] = []
    env: dict[str, str] = {}
    #: The call's own limits (`pool.exec(..., limits=)`); None: the pool's.
    limits: Limits | None = None
    #: `exec(..., capture_on_failure=True)`: a limit's failure carries the
    #: program's output (`Failure.output`). Absent in older calls: off.
    capture_on_failure: bool = False


Call = RunCall | ExecCall


class Success(msgspec.Struct, tag="success", frozen=True, kw_only=True):
    response: msgspec.Raw
    rules_version: str
    usage: Usage | None = None


class Failure(msgspec.Struct, tag="failure", frozen=True, kw_only=True):
    reason: str
    detail: str
    exit_status: int | None = None
    signal: int | None = None
    usage: Usage | None = None
    #: `RunnerError.output` (only with `capture_on_failure`); absent: None.
    output: CapturedOutput | None = None


class Hello(msgspec.Struct, tag="hello", frozen=True, kw_only=True):
    """A node actor's answer to `hello`: who it is and the rules in force,
    or why its pool did not start."""

    node_id: str
    pid: int
    rules_version: str = ""
    error: Failure | None = None


class Stats(msgspec.Struct, tag="stats", frozen=True, kw_only=True):
    pid: int
    in_flight: int
    peak_in_flight: int
    served: int
    idle_workers: int


Reply = Success | Failure

_ENCODER = msgspec.msgpack.Encoder()
_CALL = msgspec.msgpack.Decoder(Call)
_REPLY = msgspec.msgpack.Decoder(Reply)
_HELLO = msgspec.msgpack.Decoder(Hello)
_STATS = msgspec.msgpack.Decoder(Stats)


def encode(obj: object) -> bytes:
    return _ENCODER.encode(obj)


def decode_call(data: bytes) -> Call:
    return _CALL.decode(data)


def decode_reply(data: bytes) -> Reply:
    return _REPLY.decode(data)


def decode_hello(data: bytes) -> Hello:
    return _HELLO.decode(data)


def decode_stats(data: bytes) -> Stats:
    return _STATS.decode(data)


def raw(request: object) -> msgspec.Raw:
    """A `run()` request as msgpack, encoded here, on the driver.

    Raises:
        RunnerError: `bad_request` if msgspec cannot encode it, as locally.
    """
    try:
        return msgspec.Raw(_ENCODER.encode(request))
    except (TypeError, ValueError, OverflowError, RecursionError) as e:
        raise RunnerError(Reason.BAD_REQUEST, f"cannot encode frame body: {e}") from None


def failure_of(e: RunnerError) -> Failure:
    return Failure(reason=str(e.reason), detail=e.detail, exit_status=e.exit_status,
                   signal=e.signal, usage=e.usage, output=e.output)


def error_of(f: Failure) -> RunnerError:
    """The `RunnerError` a node raised, rebuilt (an unknown reason, from a
    newer node, as `internal_error`)."""
    try:
        reason = Reason(f.reason)
    except ValueError:
        return RunnerError(Reason.INTERNAL_ERROR, f"a node failed with reason {f.reason!r}:"
                           f" {f.detail}", exit_status=f.exit_status, signal=f.signal,
                           usage=f.usage)
    return RunnerError(reason, f.detail, exit_status=f.exit_status, signal=f.signal,
                       usage=f.usage, output=f.output)


def response_of(success: Success, response_type: Any) -> Any:  # noqa: ANN401  a msgspec type form
    """The response, validated as `response_type` as a local run's frame is.

    Raises:
        RunnerError: `bad_frame`, as locally.
    """
    try:
        return msgspec.msgpack.decode(success.response, type=response_type)
    except (msgspec.DecodeError, RecursionError) as e:  # ValidationError is a DecodeError
        raise RunnerError(Reason.BAD_FRAME, f"bad frame body: {e}") from None
