"""The child side's kernel layer: what the helper runs between spawn and exec.

posix only, no typing: `abi` (every constant both sides share), `install`
(the raw system calls, through `_kernel.c`), `mounts` (the jail's root and
its /proc), and `waiter.c` (the static binary the helper and pid 1 become).
The parent imports `abi` and `install.landlock_abi` from here, nothing else.
"""
