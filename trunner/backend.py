"""The backend seam: the platform's jail backend, and the jail's dir around it.

`platform_backend()` is the only place that reads `sys.platform`, and this
module the only generic one that imports the platform's package
(`trunner.linux`): the rest of trunner sees the contract in `trunner.jail`.
`open_jail` and `close_jail` make and remove the jail dir around the
backend's jail, listed with the platform's watchdog before it exists.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from trunner import cleanup
from trunner.errors import Reason, RunnerError

# The helper's exit codes (constants both sides of the Linux jail share).
from trunner.kernel.abi import (
    PROCESS_COUNT_EXIT as PROCESS_COUNT_EXIT,
    SANDBOX_SETUP_EXIT as SANDBOX_SETUP_EXIT,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from trunner.jail import Jail, JailBackend
    from trunner.limits import Limits


def platform_backend(worker: str, *, provider: Mapping[str, Any] | None = None,
                     **options: object) -> JailBackend:
    """The jail backend for this platform; `provider` configures the provider
    profile (`trunner.linux.profile.ProviderConfig`) instead of the default.

    Raises:
        RunnerError: `unsupported_platform` off Linux.
        ValueError: a bad provider configuration.
    """
    if sys.platform == "linux":
        from trunner.linux.backend import LinuxBackend

        if provider is not None:
            from trunner.linux.profile import provider_profile

            options["profile"] = provider_profile(provider)
        return LinuxBackend(worker, **options)  # type: ignore[arg-type]
    raise RunnerError(
        Reason.UNSUPPORTED_PLATFORM, f"no jail backend for {sys.platform}; refusing to run unjailed"
    )


def provider_profile_template_blake3() -> str | None:
    """The BLAKE3 of the provider jail profile template on this platform, or
    None where no provider profile is measured (no backend here). Part of
    the effective rules version whenever a provider is configured."""
    if sys.platform != "linux":
        return None
    from trunner.linux.profile import template_blake3

    return template_blake3()


def host_report() -> dict[str, Any]:
    """What holds on this host, layer by layer (`trunner doctor`); {} where
    there is no backend."""
    if sys.platform != "linux":
        return {}
    from trunner.linux.doctor import host_report as linux_report

    return linux_report()


# -- jail dirs ---------------------------------------------------------------------


def _watchdog() -> Any:  # noqa: ANN401  the platform's watchdog module
    from trunner.linux import watchdog

    return watchdog


def make_jail_dir(temp_root: str | None) -> str:
    """A fresh 0700 jail dir (`cleanup.make_jail_dir`), listed with the
    watchdog before it exists.

    Raises:
        RunnerError: `spawn_failed` if it cannot be made.
    """
    watchdog = _watchdog()
    try:
        return cleanup.make_jail_dir(temp_root, lambda path: watchdog.hold(None, path),
                                     watchdog.forget)
    except OSError as e:
        raise RunnerError(
            Reason.SPAWN_FAILED, f"cannot make the jail dir: {e.strerror} (errno {e.errno})"
        ) from None


async def remove_jail_dir(path: str) -> bool:
    """Remove a jail dir, whatever the run left in it; whether it is gone.
    Once it is, the watchdog stops listing it."""
    return await cleanup.remove_jail_dir(path, _watchdog().forget)


async def open_jail(backend: JailBackend, adapter_argv: Sequence[str], limits: Limits,
                    temp_root: str | None, in_process: str = "", stdio: str = "pipes") -> Jail:
    """A jail dir and the backend's jail in it.

    Raises:
        RunnerError: `spawn_failed`, or the backend's refusal.
    """
    backend.settle()  # before the jail dir: its watchdog stays where it starts
    jail_dir = make_jail_dir(temp_root)
    try:
        return backend.open_jail(jail_dir=jail_dir, adapter_argv=adapter_argv, limits=limits,
                                 in_process=in_process, stdio=stdio)
    except BaseException:
        await remove_jail_dir(jail_dir)  # the error in flight is the reason
        raise


async def close_jail(jail: Jail) -> bool:
    """Free what `jail` holds and remove its dir, once the run is gone;
    whether the dir is gone. Runs to the end under cancellation."""
    import trio

    with trio.CancelScope(shield=True):
        try:
            await jail.release()
        finally:
            gone = await remove_jail_dir(jail.jail_dir)
    return gone
