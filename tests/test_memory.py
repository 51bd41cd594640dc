"""The allocator setting every myriad process gets."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

import myriad.utils.memory as memory


def _glibc_version() -> tuple[int, ...]:
    try:
        version = ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):
        return ()
    version.restype = ctypes.c_char_p
    return tuple(int(p) for p in version().decode().split(".")[:2])


# A fresh process allocates 16 MiB with malloc and reports whether glibc served it with its own
# memory map (mallinfo2's count of mapped blocks, glibc >= 2.33). The module is loaded from its
# file, without the package, whose import applies the setting ("import" does that).
MAPPED_BLOCK = """
import ctypes, importlib.util, sys
spec = importlib.util.spec_from_file_location("memory", sys.argv[2])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
if sys.argv[1] == "import":
    import myriad
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
                 .split())]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
if sys.argv[1] == "set":
    assert module.keep_freed_memory()
before = libc.mallinfo2().hblks
block = libc.malloc(16 << 20)
print(libc.mallinfo2().hblks - before)
libc.free(ctypes.c_void_p(block))
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _glibc_version() < (2, 33), reason="glibc >= 2.33"
)
def test_with_it_a_16_mib_block_comes_from_the_heap_instead_of_a_fresh_map() -> None:
    def mapped(setting: str) -> int:
        cmd = [sys.executable, "-c", MAPPED_BLOCK, setting, memory.__file__]
        return int(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)

    assert mapped("default") == 1
    assert mapped("set") == 0
    # Every entry point (the command, torchrun ranks, a program using the API) imports the
    # package, which applies the process settings once (myriad.utils.process).
    assert mapped("import") == 0


def test_other_platforms_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert memory.keep_freed_memory() is False
